/**
 * runledger/workflow-world: a World for the Workflow SDK ("use workflow") on runledger
 * (docs/workflow-world.md). `@workflow/world` and `@workflow/errors` (both come with the
 * `workflow` package) are optional peer dependencies; the main entry never imports this one.
 *
 * WORKFLOW_TARGET_WORLD=runledger/workflow-world loads it: the SDK calls createWorld().
 */
export { createWorld, createWorld as default } from './world.js';
export type { RunledgerWorld, RunledgerWorldOptions } from './world.js';
export { DELIVERY_WORKFLOW } from './queue.js';
export type { DeliveryInput } from './queue.js';
