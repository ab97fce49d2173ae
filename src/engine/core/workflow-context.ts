/**
 * What a workflow function receives (`ctx`), named in core so that the workflow types
 * (core/workflow.ts: WorkflowFunction, VerifyFunction, onNoProgress) need nothing above
 * core. Its members are declared where their types live: src/agents/context.ts, whose
 * class WorkflowContext is the one implementation (the step API of src/steps/context.ts
 * and the agent API on top), merges them into this interface. `DB` is the Kysely database
 * interface of `createEngine<DB>()`; it types `trx` in `ctx.transaction`.
 */
// eslint-disable-next-line @typescript-eslint/no-empty-object-type, @typescript-eslint/no-unused-vars
export interface WorkflowContext<DB = any> {}
