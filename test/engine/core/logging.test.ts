import { spawnSync } from 'node:child_process';
import { Writable } from 'node:stream';
import pino from 'pino';
import { describe, expect, it } from 'vitest';
import { ConfigError, createEngine, type Engine } from '../../../src/index.js';
import { cliLog } from '../../../src/cli/shared.js';
import { useTestEngine } from '../../helpers/test-engine.js';

// The engine's `log` option: a function, or a pino-compatible logger; every line about a run carries its run id and workflow.
const t = useTestEngine({ engine: false });

/** A pino logger writing its JSON lines into memory. */
function memoryPino(): { logger: pino.Logger; lines: () => Record<string, unknown>[] } {
  const chunks: string[] = [];
  const sink = new Writable({
    write(chunk, _encoding, done) {
      chunks.push(String(chunk));
      done();
    },
  });
  const logger = pino({ level: 'info', base: { service: 'checkout' } }, sink);
  const lines = () =>
    chunks
      .join('')
      .split('\n')
      .filter(Boolean)
      .map((line) => JSON.parse(line) as Record<string, unknown>);
  return { logger, lines };
}

/** A run that fails with STEP_NOT_AWAITED: the worker logs an error line about it. */
async function failOneRun(engine: Engine, name: string): Promise<string> {
  const wf = engine.workflow({ name, version: 'v7' }, async (ctx) => {
    void ctx.sleep('nap', '1h');
    throw new Error('boom');
  });
  const worker = await engine.runWorker({ manual: true });
  try {
    const handle = await engine.start(wf, {});
    await worker.drain();
    expect((await engine.getRun(handle.runId))?.status).toBe('FAILED');
    return handle.runId;
  } finally {
    await worker.stop();
    await engine.close();
  }
}

describe('log option', () => {
  it("a pino logger: the engine logs through a child { component: 'runledger' }, a run's lines through a child with runId, workflow and version", async () => {
    const { logger, lines } = memoryPino();
    const runId = await failOneRun(createEngine({ connectionString: t.db.url, log: logger }), 'log-pino');
    const about = lines().filter((line) => line.runId === runId);
    expect(about.length).toBeGreaterThanOrEqual(1);
    expect(about[0]).toMatchObject({
      level: 50, // pino's error
      service: 'checkout', // the user's own bindings stay
      component: 'runledger',
      runId,
      workflow: 'log-pino',
      version: 'v7',
    });
    expect(about[0]!.msg).toMatch(/STEP_NOT_AWAITED|threw \(boom\)/);
    // No line of the run lacks its fields, and no line is logged twice.
    for (const line of lines().filter((l) => String(l.msg).includes(runId))) expect(line).toMatchObject({ runId, workflow: 'log-pino' });
  });

  it('a function: the run fields come in each line’s meta', async () => {
    const seen: { level: string; message: string; meta?: Record<string, unknown> }[] = [];
    const runId = await failOneRun(
      createEngine({ connectionString: t.db.url, log: (level, message, meta) => seen.push({ level, message, meta }) }),
      'log-function',
    );
    const about = seen.filter((line) => line.meta?.runId === runId);
    expect(about.length).toBeGreaterThanOrEqual(1);
    expect(about[0]).toMatchObject({ level: 'error', meta: { runId, workflow: 'log-function', version: 'v7' } });
  });

  it('a logger without child gets the fields merged into each call', async () => {
    const calls: [string, Record<string, unknown>, string | undefined][] = [];
    const logger = {
      info: (fields: Record<string, unknown>, message?: string) => calls.push(['info', fields, message]),
      warn: (fields: Record<string, unknown>, message?: string) => calls.push(['warn', fields, message]),
      error: (fields: Record<string, unknown>, message?: string) => calls.push(['error', fields, message]),
    };
    const runId = await failOneRun(createEngine({ connectionString: t.db.url, log: logger }), 'log-childless');
    const line = calls.find(([, fields]) => fields.runId === runId);
    expect(line?.[0]).toBe('error');
    expect(line?.[1]).toMatchObject({ runId, workflow: 'log-childless', version: 'v7' });
    expect(line?.[2]).toMatch(/threw \(boom\)/);
  });

  it('anything else is refused when the engine is created, naming what fits', () => {
    expect(() => createEngine({ connectionString: t.db.url, log: { info: () => {} } as never })).toThrow(ConfigError);
    expect(() => createEngine({ connectionString: t.db.url, log: 'stderr' as never })).toThrow(/pino-compatible logger/);
  });
});

describe('the CLI’s log (RUNLEDGER_LOG_FORMAT)', () => {
  const emit = (format: string) =>
    spawnSync(
      process.execPath,
      [
        '--import',
        'tsx',
        '-e',
        "import('./src/cli/shared.ts').then((m) => { const log = m.cliLog(true); log('warn', 'lease lost', { runId: 'r1', workflow: 'w' }); log('info', 'swept'); })",
      ],
      { env: { ...process.env, RUNLEDGER_LOG_FORMAT: format }, encoding: 'utf8' },
    );

  it('json: one pino JSON line per message on stderr, with the run fields at the top level', () => {
    const out = emit('json');
    expect(out.status).toBe(0);
    const lines = out.stderr
      .split('\n')
      .filter(Boolean)
      .map((line) => JSON.parse(line));
    expect(lines).toHaveLength(2);
    expect(lines[0]).toMatchObject({ level: 40, component: 'runledger', runId: 'r1', workflow: 'w', msg: 'lease lost' });
    expect(lines[1]).toMatchObject({ level: 30, msg: 'swept' });
  });

  it('text (the default): one plain line per message', () => {
    const out = emit('text');
    expect(out.stderr).toMatch(/^\S+ warn lease lost \{"runId":"r1","workflow":"w"\}\n\S+ info swept\n$/);
  });

  it('another value is a usage error', () => {
    expect(() => cliLog(false, { RUNLEDGER_LOG_FORMAT: 'yaml' })).toThrow(/RUNLEDGER_LOG_FORMAT must be text or json/);
  });
});
