import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';

/**
 * The framework adapters are optional: `runledger` and `runledger/agents` load in a process
 * where the AI SDK, the Agents SDK, LangGraph and the Workflow SDK cannot be found (a resolve hook refuses them), and the
 * adapters' own entries, loaded the same way, fail for want of them (so the hook works).
 */
const ROOT = resolve(import.meta.dirname, '..');
const scratch = mkdtempSync(join(tmpdir(), 'runledger-optional-'));
afterAll(() => rmSync(scratch, { recursive: true, force: true }));

const hooks = join(scratch, 'hooks.mjs');
writeFileSync(
  hooks,
  `export async function resolve(specifier, context, next) {
  if (specifier === 'ai' || specifier.startsWith('ai/') || specifier.startsWith('@ai-sdk/') || specifier.startsWith('@openai/') || specifier.startsWith('@langchain/') || specifier.startsWith('@workflow/')) {
    const error = new Error('blocked for this test: ' + specifier);
    error.code = 'ERR_MODULE_NOT_FOUND';
    throw error;
  }
  return next(specifier, context);
}
`,
);
const register = join(scratch, 'register.mjs');
writeFileSync(register, `import { register } from 'node:module';\nregister(${JSON.stringify(pathToFileURL(hooks).href)});\n`);

function load(entry: string) {
  return spawnSync(
    process.execPath,
    [
      '--import',
      register,
      '--import',
      'tsx',
      '-e',
      `await import(${JSON.stringify(pathToFileURL(join(ROOT, entry)).href)}); console.log('loaded')`,
    ],
    {
      cwd: ROOT,
      encoding: 'utf8',
      timeout: 30_000,
    },
  );
}

describe('the framework adapters are optional', () => {
  it.each(['src/index.ts', 'src/agents/index.ts'])('%s loads without ai, @ai-sdk/*, @openai/*, @langchain/* and @workflow/*', (entry) => {
    const result = load(entry);
    expect(result.stderr).not.toContain('blocked for this test');
    expect(result.stdout.trim()).toBe('loaded');
  });

  it.each([
    ['src/ai/index.ts', 'ai'],
    ['src/openai-agents/index.ts', '@openai/agents-core'],
    ['src/langgraph/index.ts', '@langchain/'],
    ['src/workflow-world/index.ts', '@workflow/'],
  ])('%s needs its framework', (entry, framework) => {
    const result = load(entry);
    expect(result.status).not.toBe(0);
    expect(result.stderr).toContain(`blocked for this test: ${framework}`);
  });
});
