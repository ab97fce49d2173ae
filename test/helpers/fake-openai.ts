import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';

/** What the fake answers to the next request. */
export interface FakeReply {
  content?: string;
  toolCalls?: Array<{ id: string; name: string; arguments: string }>;
  usage?: { prompt_tokens: number; completion_tokens: number } | null;
  finishReason?: string;
  /** Answer this HTTP status with an OpenAI-style error body instead. */
  status?: number;
  message?: string;
  retryAfterSeconds?: number;
  /** Streamed replies: characters per content delta and per tool-arguments delta; default 3. */
  chunk?: number;
  /** Send the first content delta, then nothing more until the client goes away (for abort tests). */
  hang?: boolean;
}

export interface RecordedRequest {
  path: string;
  headers: IncomingMessage['headers'];
  body: Record<string, any>;
}

/**
 * A local OpenAI-compatible chat-completions server on 127.0.0.1 (random port), for the
 * adapter's tests: replies are queued by the test; streamed requests (`stream: true`) get
 * server-sent events the way OpenAI sends them (a role delta, content deltas, tool calls in
 * pieces by index, a finish chunk, the usage chunk when include_usage asks for it, [DONE]).
 */
export class FakeOpenAi {
  readonly requests: RecordedRequest[] = [];
  readonly replies: FakeReply[] = [];
  /** Requests whose client went away before the answer ended. */
  aborted = 0;
  #server!: Server;
  url = '';

  static async start(): Promise<FakeOpenAi> {
    const fake = new FakeOpenAi();
    fake.#server = createServer((req, res) => void fake.#handle(req, res));
    await new Promise<void>((resolve) => fake.#server.listen(0, '127.0.0.1', resolve));
    const address = fake.#server.address();
    fake.url = `http://127.0.0.1:${typeof address === 'object' && address ? address.port : 0}/v1`;
    return fake;
  }

  reply(...replies: FakeReply[]): void {
    this.replies.push(...replies);
  }

  async #handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    let text = '';
    for await (const chunk of req) text += chunk;
    const body = text ? JSON.parse(text) : {};
    this.requests.push({ path: req.url ?? '', headers: req.headers, body });
    if (req.method !== 'POST' || req.url !== '/v1/chat/completions') {
      res.writeHead(404, { 'content-type': 'application/json' }).end(JSON.stringify({ error: { message: 'no such route' } }));
      return;
    }
    const reply = this.replies.shift() ?? { status: 500, message: 'the fake has no reply queued' };
    if (reply.status) {
      res
        .writeHead(reply.status, {
          'content-type': 'application/json',
          ...(reply.retryAfterSeconds ? { 'retry-after': String(reply.retryAfterSeconds) } : {}),
        })
        .end(JSON.stringify({ error: { message: reply.message ?? 'error', type: 'server_error' } }));
      return;
    }
    const usage = reply.usage === undefined ? { prompt_tokens: 10, completion_tokens: 5, total_tokens: 15 } : reply.usage;
    const finish = reply.finishReason ?? (reply.toolCalls?.length ? 'tool_calls' : 'stop');
    if (!body.stream) {
      res.writeHead(200, { 'content-type': 'application/json' }).end(
        JSON.stringify({
          id: 'chatcmpl-fake',
          object: 'chat.completion',
          choices: [
            {
              index: 0,
              message: {
                role: 'assistant',
                content: reply.content ?? null,
                ...(reply.toolCalls
                  ? {
                      tool_calls: reply.toolCalls.map((c) => ({
                        id: c.id,
                        type: 'function',
                        function: { name: c.name, arguments: c.arguments },
                      })),
                    }
                  : {}),
              },
              finish_reason: finish,
            },
          ],
          ...(usage ? { usage } : {}),
        }),
      );
      return;
    }
    res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache', connection: 'keep-alive' });
    const send = (chunk: unknown) => res.write(`data: ${JSON.stringify(chunk)}\n\n`);
    const delta = (d: Record<string, unknown>, finishReason: string | null = null) =>
      send({ id: 'chatcmpl-fake', object: 'chat.completion.chunk', choices: [{ index: 0, delta: d, finish_reason: finishReason }] });
    const size = reply.chunk ?? 3;
    delta({ role: 'assistant', content: '' });
    const content = reply.content ?? '';
    for (let at = 0; at < content.length; at += size) {
      delta({ content: content.slice(at, at + size) });
      if (reply.hang) {
        await new Promise<void>((resolve) => res.on('close', () => resolve()));
        this.aborted++;
        return;
      }
    }
    (reply.toolCalls ?? []).forEach((call, index) => {
      delta({ tool_calls: [{ index, id: call.id, type: 'function', function: { name: call.name, arguments: '' } }] });
      for (let at = 0; at < call.arguments.length; at += size) {
        delta({ tool_calls: [{ index, function: { arguments: call.arguments.slice(at, at + size) } }] });
      }
    });
    delta({}, finish);
    if (usage && body.stream_options?.include_usage) send({ id: 'chatcmpl-fake', object: 'chat.completion.chunk', choices: [], usage });
    res.end('data: [DONE]\n\n');
  }

  async stop(): Promise<void> {
    this.#server.closeAllConnections();
    await new Promise<void>((resolve) => this.#server.close(() => resolve()));
  }
}
