/**
 * The session a tool call belongs to, carried by an `AsyncLocalStorage` (Node, Deno, Bun and
 * the edge runtimes have it): concurrent runs each see their own session, and promises made
 * inside a session's callback (`Promise.all` of tool calls) keep it.
 */

import { AsyncLocalStorage } from "node:async_hooks";
import type { Session } from "./session.js";

export interface Scope {
  readonly session: Session;
  /** A call of this session holds its turn (a tool calling a tool must not wait for itself). */
  readonly holding: boolean;
}

export const SCOPE = new AsyncLocalStorage<Scope>();

/** The session the calling code runs in, or undefined outside `client.session(...)`. */
export function currentSession(): Session | undefined {
  return SCOPE.getStore()?.session;
}
