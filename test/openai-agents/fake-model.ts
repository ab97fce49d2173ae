import { Usage, type Model, type ModelRequest, type ModelResponse, type StreamEvent } from '@openai/agents-core';

/** A reply of the fake model: text, or function calls. */
export type FakeReply = { text: string } | { calls: Array<{ callId: string; name: string; input: unknown }> };

/**
 * A fake Agents SDK model answering from a script, one reply per call, counting every call
 * (a replay that called the model again would show as an extra call). Offline, no OpenAI.
 */
export class FakeAgentModel implements Model {
  readonly requests: ModelRequest[] = [];
  constructor(private readonly script: FakeReply[]) {}

  async getResponse(request: ModelRequest): Promise<ModelResponse> {
    this.requests.push(request);
    const reply = this.script[this.requests.length - 1];
    if (!reply) throw new Error(`the fake model has no reply ${this.requests.length}`);
    const usage = new Usage({ requests: 1, inputTokens: 12, outputTokens: 4, totalTokens: 16 });
    if ('text' in reply) {
      return {
        usage,
        output: [{ type: 'message', role: 'assistant', status: 'completed', content: [{ type: 'output_text', text: reply.text }] }],
      };
    }
    return {
      usage,
      output: reply.calls.map((call) => ({
        type: 'function_call' as const,
        callId: call.callId,
        name: call.name,
        arguments: JSON.stringify(call.input),
        status: 'completed' as const,
      })),
    };
  }

  // eslint-disable-next-line require-yield
  async *getStreamedResponse(): AsyncIterable<StreamEvent> {
    throw new Error('the fake model does not stream');
  }
}
