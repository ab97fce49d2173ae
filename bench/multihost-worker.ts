/**
 * One "host" of bench/multihost.ts: a worker process that reaches PostgreSQL through a
 * TCP forwarder of its own (in this process, as a sidecar proxy would be on a real host),
 * so each host has its own connections and its own network hop.
 *   MH_TARGET=postgres://... MH_HOST=host-2 MH_CONCURRENCY=16
 * Prints "READY <workerId>"; SIGTERM stops it gracefully.
 */
import { connect, createServer } from 'node:net';
import { createEngine } from '../dist/index.js';

const target = new URL(process.env.MH_TARGET!);
const host = process.env.MH_HOST ?? 'host';
const concurrency = Number(process.env.MH_CONCURRENCY ?? 16);

const proxy = createServer((client) => {
  const upstream = connect(Number(target.port || 5432), target.hostname);
  client.pipe(upstream).pipe(client);
  const close = () => {
    client.destroy();
    upstream.destroy();
  };
  client.on('error', close).on('close', close);
  upstream.on('error', close).on('close', close);
});
await new Promise<void>((resolve) => proxy.listen(0, '127.0.0.1', resolve));
const via = new URL(target);
via.hostname = '127.0.0.1';
via.port = String((proxy.address() as { port: number }).port);

const engine = createEngine({ connectionString: via.toString(), log: () => {}, poolMax: concurrency + 4 });
const flow = engine.workflow({ name: 'mh-order', queue: 'mh' }, async (ctx, input: { n: number }) => {
  const a = await ctx.step('price', () => input.n * 100);
  const b = await ctx.step('reserve', () => a + 1);
  return ctx.step('confirm', () => ({ total: b }));
});
void flow;
const worker = await engine.runWorker({ concurrency, host });
console.log(`READY ${worker.workerId}`);
process.once('SIGTERM', async () => {
  await worker.stop();
  await engine.close();
  proxy.close();
  process.exit(0);
});
