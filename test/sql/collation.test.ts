/**
 * Every text column of runledger's tables compares bytewise (COLLATE "C", sql/README.md
 * "Text compares bytewise"), whatever the database's default collation: under a linguistic
 * one each index comparison is a strcoll() (bench/results has the cost).
 *
 * Each test runs in a transaction on the shared database, rolled back at its end
 * (test/helpers/test-tx.ts). The second one adds a column to runledger.runs there: its
 * ALTER TABLE waits for the tests of other files that are using runs to end, and they wait
 * for it in turn, for the few milliseconds it lasts.
 */
import { describe, expect } from 'vitest';
import { txTest as it } from '../helpers/test-tx.js';

const NOT_BYTEWISE = `
  select format('%s.%I', a.attrelid::regclass, a.attname) as col, a.attcollation::regcollation::text as collation
    from pg_attribute a join pg_class c on c.oid = a.attrelid
   where c.relnamespace = 'runledger'::regnamespace and c.relkind in ('r', 'p')
     and a.attnum > 0 and not a.attisdropped and a.attcollation <> 0
     and a.attcollation <> 'pg_catalog."C"'::regcollation
   order by 1`;


describe('text columns of runledger', () => {
  it('are all COLLATE "C"', async ({ tx }) => {
    const textColumns = await tx.query<{ n: number }>(
      `select count(*)::int as n from pg_attribute a join pg_class c on c.oid = a.attrelid
        where c.relnamespace = 'runledger'::regnamespace and c.relkind in ('r', 'p') and a.attnum > 0 and a.attcollation <> 0`,
    );
    // The query below looks at these; there are many (so an empty answer is not for lack of columns).
    expect(textColumns.rows[0]!.n).toBeGreaterThan(90);
    const notBytewise = await tx.query(NOT_BYTEWISE);
    expect(notBytewise.rows, 'text columns without collate "C" (a new column must say collate "C", see sql/README.md)').toEqual([]);
  });

  it('finds a new column without COLLATE "C" (the check can fail)', async ({ tx }) => {
    await tx.query('alter table runledger.runs add column note_for_test text');
    const notBytewise = await tx.query(NOT_BYTEWISE);
    expect(notBytewise.rows).toEqual([{ col: 'runledger.runs.note_for_test', collation: expect.any(String) }]);
  });
});
