/**
 * runledger/langgraph: LangGraph.js on runledger (docs/langgraph.md). `@langchain/langgraph`
 * is an optional peer dependency; the main entry never imports this one.
 */
export { RunledgerSaver } from './saver.js';
export type { RunledgerSaverOptions, SaverPool } from './saver.js';
export { runGraph, graphResumeTopic } from './run-graph.js';
export type { GraphInterrupt, GraphLike, RunGraphOptions, RunGraphResult } from './run-graph.js';
