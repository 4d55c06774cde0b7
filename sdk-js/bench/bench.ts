/**
 * The SDK's overheads, each against its own baseline measured in the same run (the machine is
 * shared: absolute numbers move, ratios much less):
 *
 * 1. A SAFE wrapped call inside a session, in-process, against calling the function directly.
 * 2. intercept + commit of a compensable call through the SDK, against the same two requests
 *    sent with plain `fetch` (same keep-alive connection pool, same headers), interleaved.
 *
 * Run: `make bench-js` (a fresh server of its own, as the tests have).
 */

import { performance } from "node:perf_hooks";
import { type Session, undologTool } from "../src/index.js";
import { URL_, newAgent } from "../test/helpers.js";

const SAFE_CALLS = Number(process.env["UNDOLOG_BENCH_SAFE"] ?? 200_000);
const ROUNDS = Number(process.env["UNDOLOG_BENCH_ROUNDS"] ?? 6);
const PER_ROUND = Number(process.env["UNDOLOG_BENCH_PER_ROUND"] ?? 40);

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)] ?? NaN;
}

async function main(): Promise<void> {
  const { key, client } = await newAgent();
  const read = async ({ id }: { id: number }) => id;
  const safe = undologTool({ name: "bench_read", tier: "safe" }, read);
  const write = undologTool({ name: "bench_write", tier: "compensable",
    compensation: { fnName: "bench_unwrite", args: { id: "{id}" } } }, async ({ id }: { id: number }) => ({ id }));
  await client.registerCompensation({ fnName: "bench_unwrite", handler: "webhook", target: "http://127.0.0.1:9/undo" });
  await client.register(safe, write);

  const results: Record<string, number> = {};
  await client.session({}, async (run: Session) => {
    // 1. SAFE: warm up, then the plain function and the wrapped one, the same number of calls.
    for (let i = 0; i < 20_000; i++) await safe({ id: i });
    let t = performance.now();
    for (let i = 0; i < SAFE_CALLS; i++) await read({ id: i });
    const plainUs = ((performance.now() - t) * 1000) / SAFE_CALLS;
    t = performance.now();
    for (let i = 0; i < SAFE_CALLS; i++) await safe({ id: i });
    const wrappedUs = ((performance.now() - t) * 1000) / SAFE_CALLS;
    // The report of SAFE calls rides on the next request, at most 1,000 of them: a bench
    // that queued 200,000 would send only the first; keep the run's report honest and small.
    (run as unknown as { safe: unknown[] }).safe.length = 0;
    Object.assign(results, { safe_plain_us: plainUs, safe_wrapped_us: wrappedUs, safe_overhead_us: wrappedUs - plainUs });

    // 2. intercept + commit: the SDK, and plain fetch, interleaved round by round.
    const headers = { Authorization: `Bearer ${key}`, "Content-Type": "application/json", Accept: "application/json" };
    let step = 1_000_000;
    let n = 0;
    const viaFetch = async (): Promise<void> => {
      const id = n++;
      const answer = await fetch(`${URL_}/api/v1/sessions/${run.id}/intercept`, { method: "POST", headers,
        body: JSON.stringify({ tool: "bench_write", args: { id }, step_index: step++ }) });
      const body = await answer.json() as { effect: { id: string } };
      const done = await fetch(`${URL_}/api/v1/effects/${body.effect.id}/commit`, { method: "POST", headers,
        body: JSON.stringify({ result: { id } }) });
      await done.text();
    };
    const viaSdk = async (): Promise<void> => {
      await write({ id: n++ });
    };
    for (let i = 0; i < 10; i++) {
      await viaSdk();
      await viaFetch();
    }
    const sdkMs: number[] = [];
    const fetchMs: number[] = [];
    for (let round = 0; round < ROUNDS; round++) {
      for (const [fn, into] of (round % 2 ? [[viaFetch, fetchMs], [viaSdk, sdkMs]] : [[viaSdk, sdkMs], [viaFetch, fetchMs]]) as
        [() => Promise<void>, number[]][]) {
        for (let i = 0; i < PER_ROUND; i++) {
          const started = performance.now();
          await fn();
          into.push(performance.now() - started);
        }
      }
    }
    const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
    Object.assign(results, {
      pair_fetch_median_ms: median(fetchMs), pair_sdk_median_ms: median(sdkMs),
      pair_fetch_mean_ms: mean(fetchMs), pair_sdk_mean_ms: mean(sdkMs),
      pair_ratio_median: median(sdkMs) / median(fetchMs), pair_ratio_mean: mean(sdkMs) / mean(fetchMs),
      pairs_each: fetchMs.length,
    });
  });
  const r = results as Record<string, number>;
  const f = (x: number | undefined, d = 2) => (x ?? NaN).toFixed(d);
  console.log(`SAFE call in a session: ${f(r["safe_wrapped_us"])} µs wrapped vs ${f(r["safe_plain_us"])} µs plain `
    + `= ${f(r["safe_overhead_us"])} µs overhead (budget < 20 µs; ${SAFE_CALLS} calls)`);
  console.log(`intercept+commit: SDK ${f(r["pair_sdk_median_ms"])} ms vs plain fetch ${f(r["pair_fetch_median_ms"])} ms median `
    + `(ratio ${f(r["pair_ratio_median"], 3)}; means ${f(r["pair_sdk_mean_ms"])} / ${f(r["pair_fetch_mean_ms"])} ms, `
    + `ratio ${f(r["pair_ratio_mean"], 3)}; ${r["pairs_each"]} pairs each, interleaved; budget ≤ 1.10)`);
  console.log(JSON.stringify(results));
  const ok = r["safe_overhead_us"]! < 20 && r["pair_ratio_median"]! <= 1.1;
  process.exitCode = ok ? 0 : 1;
}

await main();
