import { createServer } from 'node:http';

/**
 * A fake payment provider on 127.0.0.1, as a real one behaves: a refund is keyed by an
 * idempotency key (the same key returns the same refund), and GET tells what became of a
 * key, so a caller that lost the answer can ask instead of refunding twice.
 *   POST /refunds?key=K&order=O&amount=N -> { refundId }     GET /refunds?key=K -> { refundId } or 404
 */
export async function startPayments() {
  const refunds = new Map<string, { refundId: string; order: string; amount: number }>();
  let posts = 0;
  const server = createServer((req, res) => {
    const url = new URL(req.url ?? '/', 'http://localhost');
    const key = url.searchParams.get('key') ?? '';
    const send = (status: number, body: unknown) => {
      res.writeHead(status, { 'content-type': 'application/json' });
      res.end(JSON.stringify(body));
    };
    if (req.method === 'POST' && url.pathname === '/refunds') {
      posts++;
      if (!refunds.has(key)) {
        refunds.set(key, {
          refundId: `re_${refunds.size + 1}`,
          order: url.searchParams.get('order') ?? '',
          amount: Number(url.searchParams.get('amount')),
        });
      }
      return send(201, refunds.get(key));
    }
    if (req.method === 'GET' && url.pathname === '/refunds') {
      const refund = refunds.get(key);
      return refund ? send(200, refund) : send(404, { error: 'no such refund' });
    }
    send(404, { error: 'unknown route' });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const address = server.address();
  return {
    url: `http://127.0.0.1:${typeof address === 'object' && address ? address.port : 0}`,
    refunds: () => [...refunds.values()],
    posts: () => posts,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}
