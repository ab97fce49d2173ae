import type { LanguageModelV4StreamPart } from '@ai-sdk/provider';

/** The durable stream topic the adapter writes AI SDK UI message chunks to, unless told otherwise. */
export const UI_STREAM_TOPIC = 'ui';

/**
 * A model stream part as the AI SDK's UI message chunk (what `toUIMessageStream` sends a
 * browser), or undefined for parts a chat UI does not show (metadata, usage, raw chunks).
 * Written to the run's durable stream while the call runs, so a browser sees the answer
 * as it comes, and a browser that reloads reads it again from the stream.
 */
export function uiChunkOfPart(part: LanguageModelV4StreamPart): Record<string, unknown> | undefined {
  switch (part.type) {
    case 'text-start':
    case 'text-end':
    case 'reasoning-start':
    case 'reasoning-end':
      return { type: part.type, id: part.id };
    case 'text-delta':
    case 'reasoning-delta':
      return { type: part.type, id: part.id, delta: part.delta };
    case 'tool-input-start':
      return { type: 'tool-input-start', toolCallId: part.id, toolName: part.toolName };
    case 'tool-input-delta':
      return { type: 'tool-input-delta', toolCallId: part.id, inputTextDelta: part.delta };
    case 'tool-call':
      return { type: 'tool-input-available', toolCallId: part.toolCallId, toolName: part.toolName, input: parseInput(part.input) };
    case 'source':
      return part.sourceType === 'url'
        ? { type: 'source-url', sourceId: part.id, url: part.url, ...(part.title ? { title: part.title } : {}) }
        : undefined;
    default:
      return undefined;
  }
}

function parseInput(input: string): unknown {
  try {
    return input.trim() === '' ? {} : JSON.parse(input);
  } catch {
    return input;
  }
}
