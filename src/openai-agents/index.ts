/**
 * runledger/openai-agents: agents written with the OpenAI Agents SDK (`@openai/agents`)
 * made durable without a rewrite (docs/openai-agents.md). `@openai/agents-core` (which
 * `@openai/agents` includes) is an optional peer dependency; the main entry never imports this one.
 */
export { runledgerSession } from './session.js';
export type { RunledgerAgentSession } from './session.js';
export { runAgentDurably } from './run.js';
export type { AgentToolContract, RunAgentDurablyOptions } from './run.js';
export { durableAgentModel } from './model.js';
