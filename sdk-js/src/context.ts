/**
 * The session the calling code runs in. Sessions carry themselves through an `AsyncLocalStorage`
 * (`SCOPE`, session.ts): concurrent runs each see their own, and promises made inside a session's
 * callback (`Promise.all` of tool calls) keep it.
 */

import { SCOPE, type Session } from "./session.js";

/** The session the calling code runs in, or undefined outside `client.session(...)`. */
export function currentSession(): Session | undefined {
  return SCOPE.getStore()?.session;
}
