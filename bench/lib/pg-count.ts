/**
 * Client round-trip counting. runledger (linked from ..) loads its own copy of `pg`
 * from ../node_modules, the peers load bench/node_modules/pg: every distinct copy
 * is patched, or one system's statements would silently count as zero.
 */
import { createRequire } from 'node:module';
import pg from 'pg';

const require = createRequire(import.meta.url);
const OWNERS = ['runledger', 'graphile-worker', 'pg-boss', '@dbos-inc/dbos-sdk'];
const EXCLUDED = Symbol.for('runledger.bench.uncounted');

let statements = 0;
let patched = false;

function pgCopies(): string[] {
  const paths = new Set<string>([require.resolve('pg')]);
  for (const owner of OWNERS) {
    try {
      // import.meta.resolve: runledger exports only an "import" condition
      paths.add(createRequire(import.meta.resolve(owner)).resolve('pg'));
    } catch {
      // a package that is not installed cannot load pg either
    }
  }
  return [...paths];
}

/** Patches Client.prototype.query of every pg copy; returns the copies' paths. */
export function countStatements(): string[] {
  const copies = pgCopies();
  if (patched) return copies;
  patched = true;
  for (const path of copies) {
    const mod = require(path) as typeof pg;
    const proto = mod.Client.prototype as unknown as { query: (...args: unknown[]) => unknown };
    const original = proto.query;
    proto.query = function countedQuery(this: Record<symbol, unknown>, ...args: unknown[]) {
      if (!this[EXCLUDED]) statements++;
      return original.apply(this, args);
    };
  }
  return copies;
}

export const statementCount = () => statements;

/** A client whose queries are not counted (the harness's own probes). */
export function uncountedClient(connectionString: string): pg.Client {
  const client = new pg.Client({ connectionString });
  (client as unknown as Record<symbol, unknown>)[EXCLUDED] = true;
  return client;
}
