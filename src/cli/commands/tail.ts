import { DEFAULT_STREAM_TOPIC, STREAM_TOPIC_PATTERN } from '../../engine/core/stream-topic.js';
import { CliError, intOption, parse, withEngine, type Command, cliIo } from '../shared.js';

/**
 * `runledger tail RUN_ID [TOPIC]`: a run's durable stream as it is written, until it is
 * closed or the run ends (Ctrl-C stops earlier). The topic defaults to 'model', the one
 * ctx.generate writes a model's partial output to. A string chunk is printed as it is (a
 * model's text reads as text), any other value as one JSON line; --json prints one
 * `{"offset", "chunk", "attempt"}` line per chunk.
 */
export const tail: Command = {
  summary: `a run's durable stream, live, until it is closed or the run ends (default topic '${DEFAULT_STREAM_TOPIC}')`,
  usage: `runledger tail RUN_ID [TOPIC (default ${DEFAULT_STREAM_TOPIC})] [--from OFFSET (default 0)] [--json]`,
  args: [
    ['RUN_ID', 'the run whose stream to follow'],
    ['TOPIC', `the stream's topic (default ${DEFAULT_STREAM_TOPIC}, where ctx.generate writes a model's output)`],
  ],
  examples: ['runledger tail 01J9Z3K4X8Q2W5E7R1T6Y0U3IO', 'runledger tail 01J9Z3K4X8Q2W5E7R1T6Y0U3IO progress --from 120 --json'],
  async run(args) {
    const parsed = parse(
      tail,
      args,
      {
        from: { type: 'string', value: 'OFFSET', help: 'start at this chunk offset (default 0: from the beginning)' },
        json: { type: 'boolean', help: 'print one {"offset", "chunk", "attempt"} JSON line per chunk' },
      },
      { min: 1, max: 2 },
    );
    if (!parsed) return;
    const { values, positionals } = parsed;
    const runId = positionals[0]!;
    const topic = positionals[1] ?? DEFAULT_STREAM_TOPIC;
    if (!STREAM_TOPIC_PATTERN.test(topic)) {
      throw new CliError('USAGE', `invalid topic ${JSON.stringify(topic)}: a letter or digit, then letters, digits and _ . : / -`);
    }
    const fromOffset = intOption(values, 'from', 0) ?? 0;
    const json = values.json === true;
    await withEngine(values, async (engine) => {
      const stop = new AbortController();
      const onInterrupt = () => stop.abort();
      process.once('SIGINT', onInterrupt);
      try {
        if (positionals[1] === undefined) await hintOtherTopics(engine.pool, runId, topic);
        let atLineStart = true;
        for await (const { offset, chunk, attempt } of engine.readStream(runId, topic, { fromOffset, signal: stop.signal })) {
          if (json) {
            cliIo().stdout.write(`${JSON.stringify({ offset, chunk, attempt })}\n`);
          } else if (typeof chunk === 'string') {
            cliIo().stdout.write(chunk);
            if (chunk !== '') atLineStart = chunk.endsWith('\n');
          } else {
            cliIo().stdout.write(`${atLineStart ? '' : '\n'}${JSON.stringify(chunk)}\n`);
            atLineStart = true;
          }
        }
        if (!atLineStart) cliIo().stdout.write('\n');
      } finally {
        process.off('SIGINT', onInterrupt);
      }
    });
  },
};

/** Without a TOPIC: if the run has streams but none on the default topic, say which it has (on stderr). */
async function hintOtherTopics(
  pool: { query: (text: string, values: unknown[]) => Promise<{ rows: Array<{ topic: string }> }> },
  runId: string,
  topic: string,
) {
  const { rows } = await pool.query('select topic from runledger.streams where run_id = $1 order by topic', [runId]);
  const topics = rows.map((row) => row.topic);
  if (topics.length > 0 && !topics.includes(topic)) {
    cliIo().stderr.write(
      `run ${runId} has no stream on topic '${topic}' yet; its streams: ${topics.join(', ')} (runledger tail ${runId} TOPIC)\n`,
    );
  }
}
