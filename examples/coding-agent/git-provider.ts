/**
 * A fake git provider on 127.0.0.1 (an HTTP server the demo process runs): pull
 * requests that can be merged once. It behaves as real providers do for a merge with
 * an idempotency key: a repeated request with the same key returns the first merge,
 * and the merge can be looked up by its key (what the agent's reconcile asks).
 *
 *   POST /pulls/:n/merge      header Idempotency-Key   -> 200 { sha, pr, key } (the same for a repeat)
 *   GET  /pulls/:n/merge?key=K                          -> 200 the merge made with K, or 404
 *   GET  /stats                                         -> { requests, merges }
 */
import { createServer, type Server } from 'node:http';
import { createHash } from 'node:crypto';

export interface Merge {
  pr: number;
  sha: string;
  key: string;
}

export interface GitProvider {
  url: string;
  /** Every merge request received, repeats included. */
  requests(): number;
  /** Merges really made (a repeated key does not merge again). */
  merges(): Merge[];
  close(): Promise<void>;
}

export async function startGitProvider(): Promise<GitProvider> {
  const merged = new Map<number, Merge>();
  let requests = 0;
  const server: Server = createServer((req, res) => {
    const url = new URL(req.url ?? '/', 'http://localhost');
    const match = /^\/pulls\/(\d+)\/merge$/.exec(url.pathname);
    const reply = (status: number, body: unknown) => {
      res.writeHead(status, { 'content-type': 'application/json' });
      res.end(JSON.stringify(body));
    };
    if (url.pathname === '/stats') return reply(200, { requests, merges: [...merged.values()] });
    if (!match) return reply(404, { error: 'not found' });
    const pr = Number(match[1]);
    if (req.method === 'POST') {
      requests++;
      const key = req.headers['idempotency-key'];
      if (typeof key !== 'string' || key === '') return reply(400, { error: 'Idempotency-Key is required' });
      const existing = merged.get(pr);
      if (existing) return existing.key === key ? reply(200, existing) : reply(409, { error: `pull ${pr} is already merged` });
      const merge = { pr, key, sha: createHash('sha1').update(`${pr}:${key}`).digest('hex').slice(0, 12) };
      merged.set(pr, merge);
      return reply(200, merge);
    }
    const existing = merged.get(pr);
    return existing && existing.key === url.searchParams.get('key') ? reply(200, existing) : reply(404, { error: 'no such merge' });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const address = server.address();
  const port = typeof address === 'object' && address ? address.port : 0;
  return {
    url: `http://127.0.0.1:${port}`,
    requests: () => requests,
    merges: () => [...merged.values()],
    close: () => new Promise((resolve) => server.close(() => resolve())),
  };
}
