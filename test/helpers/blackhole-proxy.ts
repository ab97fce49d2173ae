import { createServer, connect, type Server, type Socket } from 'node:net';

/**
 * A TCP proxy in front of PostgreSQL that can turn into a blackhole: from blackhole() on
 * it forwards nothing in either direction and drops what arrives, yet keeps every socket
 * open and never sends FIN or RST, and accepts new connections that it never forwards.
 * The client sees a half-open connection: its queries get no answer and no error. The
 * kernel still acknowledges the client's segments (and TCP keepalives), as a silent
 * middlebox or a peer whose process froze would.
 */
export class BlackholeProxy {
  readonly #server: Server;
  readonly #sockets = new Set<Socket>();
  #blackholed = false;
  /** Connections accepted so far, and those accepted after blackhole() (never forwarded). */
  connections = 0;
  bytesDropped = 0;

  private constructor(
    server: Server,
    readonly port: number,
  ) {
    this.#server = server;
  }

  static async start(target: { host: string; port: number }): Promise<BlackholeProxy> {
    let proxy!: BlackholeProxy;
    const server = createServer((client) => proxy.#pipe(client, target));
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const address = server.address();
    proxy = new BlackholeProxy(server, typeof address === 'object' && address ? address.port : 0);
    return proxy;
  }

  /** From now on nothing passes, and nothing is closed. */
  blackhole(): void {
    this.#blackholed = true;
  }

  #pipe(client: Socket, target: { host: string; port: number }): void {
    this.connections++;
    this.#sockets.add(client);
    client.on('error', () => undefined);
    if (this.#blackholed) {
      client.on('data', (chunk: Buffer) => (this.bytesDropped += chunk.length));
      return;
    }
    const upstream = connect(target.port, target.host);
    this.#sockets.add(upstream);
    const forward = (to: Socket) => (chunk: Buffer) => {
      if (this.#blackholed) this.bytesDropped += chunk.length;
      else to.write(chunk);
    };
    client.on('data', forward(upstream));
    upstream.on('data', forward(client));
    // Before the blackhole a closed side closes the other; after it, nothing is passed on, not even a close.
    const kill = () => {
      if (this.#blackholed) return;
      client.destroy();
      upstream.destroy();
    };
    client.on('close', kill);
    upstream.on('error', () => undefined).on('close', kill);
  }

  async stop(): Promise<void> {
    for (const socket of this.#sockets) socket.destroy();
    await new Promise<void>((resolve) => this.#server.close(() => resolve()));
  }
}
