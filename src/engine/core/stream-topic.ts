import { InvalidInputError } from './errors.js';

/**
 * Stream topics are plain names (the signal topics' rule): a letter or digit, then up
 * to 99 of letters, digits and `_ . : / -`. Checked here, where a workflow opens a
 * stream and where a reader asks for one, and again in SQL (runledger._stream_write,
 * the tables' CHECK); never spliced into SQL text.
 */
export const STREAM_TOPIC_PATTERN = /^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,99}$/;

/** The topic ctx.generate writes a model's partial output to, and the one `runledger tail` reads by default. */
export const DEFAULT_STREAM_TOPIC = 'model';

/** Refuses a topic that is not a plain name with INVALID_INPUT (`what` names the call). */
export function checkStreamTopic(topic: unknown, what: string): asserts topic is string {
  if (typeof topic !== 'string' || !STREAM_TOPIC_PATTERN.test(topic)) {
    throw new InvalidInputError(
      `${what}: invalid stream topic ${JSON.stringify(topic)}: a letter or digit, then up to 99 of letters, digits and _ . : / -`,
      { details: { topic } },
    );
  }
}
