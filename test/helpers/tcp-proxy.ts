import { createServer, connect, type Server, type Socket } from 'node:net';

export type CommitFault = 'drop-reply' | 'drop-request';

/**
 * A TCP proxy in front of PostgreSQL that can break one connection exactly at a
 * COMMIT: either after the server received it (the commit happens, the client
 * never hears) or before (the commit never happens). The client sees the same
 * lost connection in both cases: the outcome is unknown to it.
 */
export class CommitFaultProxy {
  readonly #server: Server;
  readonly #sockets = new Set<Socket>();
  #armed: CommitFault | undefined;
  faultsInjected = 0;

  private constructor(
    server: Server,
    readonly port: number,
  ) {
    this.#server = server;
  }

  static async start(target: { host: string; port: number }): Promise<CommitFaultProxy> {
    let proxy!: CommitFaultProxy;
    const server = createServer((client) => proxy.#pipe(client, target));
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const address = server.address();
    proxy = new CommitFaultProxy(server, typeof address === 'object' && address ? address.port : 0);
    return proxy;
  }

  /** The next COMMIT through the proxy gets this fault. */
  arm(fault: CommitFault): void {
    this.#armed = fault;
  }

  #pipe(client: Socket, target: { host: string; port: number }): void {
    const upstream = connect(target.port, target.host);
    this.#sockets.add(client).add(upstream);
    let breakOnReply = false;
    const kill = () => {
      client.destroy();
      upstream.destroy();
    };
    client.on('data', (chunk: Buffer) => {
      if (this.#armed && /\bcommit\b/i.test(chunk.toString('latin1'))) {
        const fault = this.#armed;
        this.#armed = undefined;
        this.faultsInjected++;
        if (fault === 'drop-request') return kill();
        breakOnReply = true;
      }
      upstream.write(chunk);
    });
    upstream.on('data', (chunk: Buffer) => {
      if (breakOnReply) return kill();
      client.write(chunk);
    });
    client.on('error', kill).on('close', kill);
    upstream.on('error', kill).on('close', kill);
  }

  async stop(): Promise<void> {
    for (const socket of this.#sockets) socket.destroy();
    await new Promise<void>((resolve) => this.#server.close(() => resolve()));
  }
}
