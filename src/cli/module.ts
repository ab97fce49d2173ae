/** The user's module of workflows, as `runledger worker --module` and `runledger start --module` load it. */
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import type { Engine } from '../engine/index.js';
import type { Workflow } from '../engine/core/workflow.js';
import { CliError, EXIT_FAILED } from './shared.js';

export type Register = (engine: Engine) => unknown;

/** The module's `register` export, or its default export: a function that defines workflows on the engine it is given. */
export async function loadRegister(path: string): Promise<Register> {
  let mod: { default?: unknown; register?: unknown };
  try {
    mod = await import(pathToFileURL(resolve(path)).href);
  } catch (error) {
    throw new CliError('MODULE', `cannot load --module ${path}: ${(error as Error).message}`, EXIT_FAILED);
  }
  const fn = typeof mod.register === 'function' ? mod.register : mod.default;
  if (typeof fn !== 'function') {
    throw new CliError(
      'MODULE',
      `${path} must export register(engine) or a default function that defines workflows on the engine`,
      EXIT_FAILED,
    );
  }
  return fn as Register;
}

/**
 * Runs the module's register function on `engine` and returns the workflows it defined
 * (engine.workflow is watched for the call; the engine is otherwise the one given).
 */
export async function definedWorkflows(engine: Engine, register: Register): Promise<Array<Workflow<any, any, any>>> {
  const defined: Array<Workflow<any, any, any>> = [];
  const watched = Object.create(engine) as Engine;
  watched.workflow = ((options: Parameters<Engine['workflow']>[0], fn: Parameters<Engine['workflow']>[1]) => {
    const workflow = engine.workflow(options, fn);
    defined.push(workflow);
    return workflow;
  }) as Engine['workflow'];
  await register(watched);
  return defined;
}
