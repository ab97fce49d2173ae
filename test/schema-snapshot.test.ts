/**
 * sql/schema.snapshot.sql is the reviewable picture of the schema: it must equal what the
 * migrations build. A change to sql/ without a regenerated snapshot fails here.
 */
import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestDatabase, type TestDatabase } from './helpers/database.js';
import { SNAPSHOT_FILE, snapshotFileText } from './schema/write-snapshot.js';
import { unqualifySingleRelationView } from './schema/snapshot.js';

let db: TestDatabase;

beforeAll(async () => {
  db = await createTestDatabase();
});

afterAll(async () => {
  await db?.drop();
});

async function snapshotOfTestDatabase(): Promise<string> {
  const client = await db.pool.connect();
  try {
    return await snapshotFileText(client);
  } finally {
    client.release();
  }
}

describe('sql/schema.snapshot.sql', () => {
  it('equals the schema the migrations build', async () => {
    const committed = readFileSync(SNAPSHOT_FILE, 'utf8');
    const actual = await snapshotOfTestDatabase();
    // toBe on the strings shows the differing lines.
    expect(actual, 'sql/schema.snapshot.sql is out of date: run `npm run schema:snapshot` and commit the result').toBe(committed);
  });

  it('differs as soon as one function body or one comment changes (the check can fail)', async () => {
    const committed = readFileSync(SNAPSHOT_FILE, 'utf8');
    const client = await db.pool.connect();
    try {
      await client.query('begin');
      try {
        await client.query(`create or replace function runledger._max_payload_bytes() returns int
          language sql stable parallel safe as $$ select 1 $$`);
        const changedBody = await snapshotFileText(client);
        expect(changedBody).not.toBe(committed);
        expect(changedBody).toContain('select 1');
      } finally {
        await client.query('rollback');
      }
      await client.query('begin');
      try {
        await client.query(`comment on column runledger.runs.priority is 'a comment the migrations do not write'`);
        const changedComment = await snapshotFileText(client);
        expect(changedComment).not.toBe(committed);
        expect(changedComment).toContain(`COMMENT ON COLUMN runledger.runs.priority IS 'a comment the migrations do not write';`);
      } finally {
        await client.query('rollback');
      }
      // Undone: equal again.
      expect(await snapshotFileText(client)).toBe(committed);
    } finally {
      client.release();
    }
  });
});

describe('unqualifySingleRelationView (PostgreSQL 15 view text in the form of 16 and later)', () => {
  it('drops the alias of a single-relation view at the top level, keeps it in subqueries and strings', () => {
    const pg15 = [
      ' SELECT r.run_id,',
      "    r.status = 'r.x'::text AS odd,",
      '    ( SELECT count(*) AS count',
      '           FROM runledger.steps s',
      '          WHERE s.run_id = r.run_id) AS steps_done,',
      '    count(*) FILTER (WHERE r.admitted) AS admitted',
      '   FROM runledger.runs r',
      '  WHERE r.status = ANY (ARRAY[1, 2]);',
    ].join('\n');
    expect(unqualifySingleRelationView(pg15)).toBe(
      [
        ' SELECT run_id,',
        "    status = 'r.x'::text AS odd,",
        '    ( SELECT count(*) AS count',
        '           FROM runledger.steps s',
        '          WHERE s.run_id = r.run_id) AS steps_done,',
        '    count(*) FILTER (WHERE admitted) AS admitted',
        '   FROM runledger.runs r',
        '  WHERE status = ANY (ARRAY[1, 2]);',
      ].join('\n'),
    );
  });

  it('leaves a view over a join or a union as it is', () => {
    const join = ' SELECT a.x,\n    r.y\n   FROM runledger.a a\n     JOIN runledger.runs r ON r.id = a.id;';
    const union = ' SELECT e.x\n   FROM runledger.events e\nUNION ALL\n SELECT s.x\n   FROM runledger.steps s;';
    expect(unqualifySingleRelationView(join)).toBe(join);
    expect(unqualifySingleRelationView(union)).toBe(union);
  });
});
