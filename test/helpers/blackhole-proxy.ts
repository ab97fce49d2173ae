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
  /** blackhole({ hold: true }): what arrives is kept, in order, and delivered by heal() (a network partition that heals: TCP retransmits). */
  #hold = false;
  readonly #held: Array<() => void> = [];
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

  /**
   * From now on nothing passes, and nothing is closed. With `hold`, what arrives is kept
   * for heal() instead of dropped: a partition rather than a lost peer.
   */
  blackhole(options: { hold?: boolean } = {}): void {
    this.#blackholed = true;
    this.#hold = options.hold ?? false;
  }

  /**
   * The partition heals: what was held reaches the other side, late and in order (a write
   * the client sent before the cut arrives now), connections made during the cut reach the
   * server, closes pass again.
   */
  heal(): void {
    this.#blackholed = false;
    for (const deliver of this.#held.splice(0)) deliver();
  }

  #pipe(client: Socket, target: { host: string; port: number }): void {
    this.connections++;
    this.#sockets.add(client);
    client.on('error', () => undefined);
    if (this.#blackholed && !this.#hold) {
      client.on('data', (chunk: Buffer) => (this.bytesDropped += chunk.length));
      return;
    }
    const opened: { upstream?: Socket } = {};
    const open = () => {
      const upstream = connect(target.port, target.host);
      opened.upstream = upstream;
      this.#sockets.add(upstream);
      upstream.on('data', forward(client));
      upstream.on('error', () => undefined).on('close', kill);
      return upstream;
    };
    const forward = (to: Socket | (() => Socket)) => (chunk: Buffer) => {
      const send = () => (typeof to === 'function' ? to() : to).write(chunk);
      if (!this.#blackholed) send();
      else if (this.#hold) this.#held.push(send);
      else this.bytesDropped += chunk.length;
    };
    // Before the blackhole a closed side closes the other; after it, nothing is passed on, not even a close (held for heal()).
    const kill = () => {
      const close = () => {
        client.destroy();
        opened.upstream?.destroy();
      };
      if (!this.#blackholed) close();
      else if (this.#hold) this.#held.push(close);
    };
    // A connection made during a held cut reaches the server when it heals.
    const upstreamOf = () => opened.upstream ?? open();
    if (this.#blackholed) this.#held.push(() => void upstreamOf());
    else open();
    client.on('data', forward(upstreamOf));
    client.on('close', kill);
  }

  async stop(): Promise<void> {
    for (const socket of this.#sockets) socket.destroy();
    await new Promise<void>((resolve) => this.#server.close(() => resolve()));
  }
}
