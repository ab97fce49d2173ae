import { print } from '../format.js';
import { parse, withEngine, type Command } from '../shared.js';

/** Idempotent and safe to run from several deploy jobs at once: migrate() serialises them with an advisory lock. */
export const migrate: Command = {
  summary: 'create or upgrade the runledger schema',
  usage: 'runledger migrate [--database-url URL]',
  details: 'Idempotent; safe to run from several deploy jobs at once (an advisory lock serialises them).',
  examples: ['runledger migrate', 'runledger migrate --database-url postgres://admin@db/app'],
  async run(args) {
    const parsed = parse(migrate, args);
    if (!parsed) return;
    const { applied } = await withEngine(parsed.values, (engine) => engine.migrate());
    print(applied.length === 0 ? 'schema runledger is up to date' : `applied ${applied.join(', ')}`);
  },
};
