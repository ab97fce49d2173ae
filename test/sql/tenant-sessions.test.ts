/**
 * Migration 0033_tenant_sessions_and_shared_actions on a database that already has sessions:
 * each session takes the tenant of the runs that used it (its holder, else its last holder,
 * else the run of its first entry), with its history; a run of another tenant that was
 * queued for it (which the old key allowed) gets its own tenant's session of that id, and is
 * handed it at once. The behaviour with isolation on, through real workers, is in
 * test/tenants.test.ts ("sessions belong to a tenant").
 */
import { describe, expect, it } from 'vitest';
import { loadMigrations } from '../../src/index.js';
import { runMigration, withEmptyDatabase } from '../helpers/empty-database.js';

describe('migration 0033_tenant_sessions_and_shared_actions', () => {
  const migrations = loadMigrations();
  const tenantSessions = migrations.find((m) => m.version === 33)!;

  it('gives each existing session the tenant of its runs, and a run queued across tenants its own session', async () => {
    expect(tenantSessions.name).toBe('0033_tenant_sessions_and_shared_actions');
    await withEmptyDatabase('rl_tenant_sessions', async (client) => {
      for (const m of migrations.filter((m) => m.version < 33)) await runMigration(client, m.text);
      await client.query(
        `insert into runledger.workflows (workflow_name, workflow_version, queue_name, max_recovery_attempts) values ('w', '1', 'default', 3)`,
      );
      const start = async (tenant: string | null) =>
        (await client.query(`select runledger.start_run('w', '{}', $1) as id`, [tenant ? { tenant_id: tenant } : {}])).rows[0].id as string;
      const call = (sql: string, params: unknown[]) => client.query(sql, params);
      const [acme, globex, plain, acmeBefore] = [await start('acme'), await start('globex'), await start(null), await start('acme')];
      // 'chat': held by an acme run that appended to it, and globex's run queued behind it.
      await call(`select runledger._session_acquire('chat', $1)`, [acme]);
      await call(`select runledger._session_append('chat', $1, 0, '[{"role": "user", "content": "acme 1"}]')`, [acme]);
      expect((await call(`select runledger._session_acquire('chat', $1) as a`, [globex])).rows[0].a).toMatchObject({ held: false });
      // 'plain': a run without a tenant; 'earlier': an acme run's, released since.
      for (const [id, run] of [
        ['plain', plain],
        ['earlier', acmeBefore],
      ] as const) {
        await call(`select runledger._session_acquire($1, $2)`, [id, run]);
        await call(`select runledger._session_append($1, $2, 0, '[{"role": "user", "content": "hello"}]')`, [id, run]);
        await call(`select runledger._session_release($1, $2)`, [id, run]);
      }

      for (const m of migrations.filter((m) => m.version >= 33)) await runMigration(client, m.text);

      const sessions = await client.query(
        `select session_id, tenant_id, holder_run_id, entry_count from runledger.sessions order by session_id, tenant_id`,
      );
      expect(sessions.rows).toEqual([
        { session_id: 'chat', tenant_id: 'acme', holder_run_id: acme, entry_count: 1 },
        { session_id: 'chat', tenant_id: 'globex', holder_run_id: globex, entry_count: 0 },
        { session_id: 'earlier', tenant_id: 'acme', holder_run_id: null, entry_count: 1 },
        { session_id: 'plain', tenant_id: '', holder_run_id: null, entry_count: 1 },
      ]);
      const entries = await client.query(`select session_id, tenant_id, seq from runledger.session_entries order by 1, 2, 3`);
      expect(entries.rows).toEqual([
        { session_id: 'chat', tenant_id: 'acme', seq: 1 },
        { session_id: 'earlier', tenant_id: 'acme', seq: 1 },
        { session_id: 'plain', tenant_id: '', seq: 1 },
      ]);
      expect((await client.query('select count(*)::int as n from runledger.session_waiters')).rows[0].n).toBe(0);
      // The queued run was handed its own session and woken, as a hand-off does.
      const woken = await call(`select topic from runledger.signals where run_id = $1`, [globex]);
      expect(woken.rows).toEqual([{ topic: 'session:chat' }]);
      // It appends to a history of its own; a later acme run reads acme's.
      await call(`select runledger._session_append('chat', $1, 1, '[{"role": "user", "content": "globex 1"}]')`, [globex]);
      const acmeLater = await start('acme');
      expect((await call(`select runledger._session_acquire('earlier', $1) as a`, [acmeLater])).rows[0].a).toEqual({
        held: true,
        entry_count: 1,
      });
      const history = async (tenant: string) => {
        await client.query(`select set_config('runledger.tenant', $1, false)`, [tenant]);
        return (await client.query(`select content from runledger.session_history('chat')`)).rows.map((r) => r.content);
      };
      expect(await history('acme')).toEqual(['acme 1']);
      expect(await history('globex')).toEqual(['globex 1']);
    });
  });
});
