import { createServer, type Server } from 'node:http';

/**
 * A real external service for operation-ledger tests, on 127.0.0.1: creates tickets,
 * de-duplicates by idempotency key, counts every call per key, and can hold a reply
 * so a test can kill the caller after the service acted but before it answered.
 *   POST /tickets?key=K   -> { id }   (the same key returns the same ticket)
 *   GET  /tickets?key=K   -> { id } or 404 (for reconcile)
 *   POST /cancel?key=K    -> compensation calls, counted too
 * While rejecting (reject(true)), POST /tickets is counted but answers 422 and creates nothing.
 */
export class TicketService {
  readonly calls = new Map<string, number>();
  readonly tickets = new Map<string, string>();
  readonly cancellations = new Map<string, number>();
  #holdReplies = false;
  #reject = false;
  #held: Array<() => void> = [];
  #server!: Server;
  url = '';

  static async start(): Promise<TicketService> {
    const service = new TicketService();
    service.#server = createServer((req, res) => {
      const url = new URL(req.url ?? '/', 'http://localhost');
      const key = url.searchParams.get('key') ?? '';
      const send = (status: number, body: unknown) => {
        res.writeHead(status, { 'content-type': 'application/json' });
        res.end(JSON.stringify(body));
      };
      if (req.method === 'POST' && url.pathname === '/tickets') {
        service.calls.set(key, (service.calls.get(key) ?? 0) + 1);
        if (service.#reject) return send(422, { error: 'ticket rejected', code: 'TICKET_REJECTED' });
        if (!service.tickets.has(key)) service.tickets.set(key, `T-${service.tickets.size + 1}`);
        const reply = () => send(201, { id: service.tickets.get(key) });
        if (service.#holdReplies) service.#held.push(reply);
        else reply();
      } else if (req.method === 'GET' && url.pathname === '/tickets') {
        const id = service.tickets.get(key);
        if (id) send(200, { id });
        else send(404, { error: 'no such ticket' });
      } else if (req.method === 'POST' && url.pathname === '/cancel') {
        service.cancellations.set(key, (service.cancellations.get(key) ?? 0) + 1);
        send(200, { cancelled: key });
      } else {
        send(404, { error: 'unknown route' });
      }
    });
    await new Promise<void>((resolve) => service.#server.listen(0, '127.0.0.1', resolve));
    const address = service.#server.address();
    service.url = `http://127.0.0.1:${typeof address === 'object' && address ? address.port : 0}`;
    return service;
  }

  /** Replies are held (the ticket is created, the answer not sent) until release(). */
  holdReplies(hold: boolean): void {
    this.#holdReplies = hold;
    if (!hold) for (const reply of this.#held.splice(0)) reply();
  }

  /** While true, every POST /tickets is refused with 422 (the call is still counted). */
  reject(reject: boolean): void {
    this.#reject = reject;
  }

  totalCalls(): number {
    return [...this.calls.values()].reduce((a, b) => a + b, 0);
  }

  async stop(): Promise<void> {
    this.holdReplies(false);
    this.#server.closeAllConnections();
    await new Promise<void>((resolve) => this.#server.close(() => resolve()));
  }
}
