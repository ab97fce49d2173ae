/**
 * The layering rule of src/ (docs/architecture.md): imports run one way,
 * core → observe (traces and metrics) → db → client and run → steps → agents → worker → the engine entry → console → cli, dev, testing.
 * `npm run lint:deps` checks it, in `npm test`'s CI job; a violation fails the build.
 */
const layer = (name) => `^src/engine/${name}/`;

/** Each layer may import only the layers below it (and itself). */
const allowedBelow = {
  core: [layer('core')],
  // Traces and metrics (signals about the engine): beside core, usable from every layer above it.
  observe: [layer('core'), layer('observe')],
  db: [layer('core'), layer('db')],
  client: [layer('core'), layer('db'), layer('observe'), layer('client')],
  run: [layer('core'), layer('db'), layer('observe'), layer('run')],
  steps: [layer('core'), layer('db'), layer('observe'), layer('run'), '^src/steps/'],
  agents: [layer('core'), layer('db'), layer('observe'), layer('run'), '^src/steps/', '^src/agents/'],
  worker: [layer('core'), layer('db'), layer('observe'), layer('client'), layer('run'), '^src/steps/', '^src/agents/', layer('worker')],
};

const layerRule = (name, from) => ({
  name: `layer-${name}`,
  severity: 'error',
  comment: `${name} may import only ${allowedBelow[name].join(', ')}`,
  from: { path: from },
  to: { path: '^src/', pathNot: allowedBelow[name] },
});

module.exports = {
  forbidden: [
    {
      name: 'no-circular',
      severity: 'error',
      comment: 'No import circles, not even type-only ones.',
      from: {},
      to: { circular: true },
    },
    layerRule('core', layer('core')),
    layerRule('observe', layer('observe')),
    layerRule('db', layer('db')),
    layerRule('client', layer('client')),
    layerRule('run', layer('run')),
    layerRule('steps', '^src/steps/'),
    layerRule('agents', '^src/agents/'),
    layerRule('worker', layer('worker')),
    {
      name: 'engine-internals-stay-inside',
      severity: 'error',
      comment:
        'outside src/engine, src/steps and src/agents, code uses the engine entry (src/engine/index.ts) or core, never worker or run internals',
      from: { path: '^src/', pathNot: ['^src/engine/', '^src/steps/', '^src/agents/', '^src/testing/', '^src/index\\.ts$'] },
      to: { path: [layer('worker'), layer('run'), '^src/steps/'] },
    },
    {
      name: 'layer-console',
      severity: 'error',
      comment:
        'the web console (src/console) is a front end like the CLI: it uses the engine entry, client, core and db, ' +
        'and only cli and dev import it',
      from: { path: '^src/console/' },
      to: { path: '^src/', pathNot: ['^src/console/', layer('core'), layer('db'), layer('client'), '^src/engine/index\\.ts$'] },
    },
    {
      name: 'console-used-by-cli-and-dev',
      severity: 'error',
      comment: 'only the CLI (runledger ui) and dev (runledger dev) import the console',
      from: { path: '^src/', pathNot: ['^src/console/', '^src/cli/', '^src/dev/'] },
      to: { path: '^src/console/' },
    },
    {
      name: 'framework-adapters-use-public-entries',
      severity: 'error',
      comment:
        'the framework adapters (src/ai, src/openai-agents and their shared src/adapters) are built as a user would build ' +
        'them: on the public entries (src/index.ts, src/agents/index.ts), never on engine, steps or agents internals',
      from: { path: ['^src/ai/', '^src/openai-agents/', '^src/langgraph/', '^src/workflow-world/', '^src/adapters/'] },
      to: {
        path: '^src/',
        pathNot: [
          '^src/ai/',
          '^src/openai-agents/',
          '^src/langgraph/',
          '^src/workflow-world/',
          '^src/adapters/',
          '^src/index\\.ts$',
          '^src/agents/index\\.ts$',
        ],
      },
    },
    {
      name: 'framework-adapters-stay-optional',
      severity: 'error',
      comment:
        'nothing but the adapters imports them: the main entry and runledger/agents load without the AI SDK or the Agents SDK installed',
      from: { path: '^src/', pathNot: ['^src/ai/', '^src/openai-agents/', '^src/langgraph/', '^src/workflow-world/', '^src/adapters/'] },
      to: { path: ['^src/ai/', '^src/openai-agents/', '^src/langgraph/', '^src/workflow-world/', '^src/adapters/'] },
    },
    {
      name: 'frameworks-only-in-their-adapter',
      severity: 'error',
      comment:
        "a framework package is imported only by its adapter: 'ai' and '@ai-sdk/*' by src/ai, '@openai/agents*' by src/openai-agents",
      from: { path: '^src/', pathNot: ['^src/ai/'] },
      to: { path: ['node_modules/ai/', 'node_modules/@ai-sdk/'], dependencyTypesNot: ['type-only'] },
    },
    {
      name: 'langgraph-only-in-its-adapter',
      severity: 'error',
      comment: "'@langchain/*' is imported only by src/langgraph",
      from: { path: '^src/', pathNot: ['^src/langgraph/'] },
      to: { path: 'node_modules/@langchain/' },
    },
    {
      name: 'workflow-sdk-only-in-its-adapter',
      severity: 'error',
      comment: "'@workflow/*' (the Workflow SDK) is imported only by src/workflow-world",
      from: { path: '^src/', pathNot: ['^src/workflow-world/'] },
      to: { path: 'node_modules/@workflow/' },
    },
    {
      name: 'agents-sdk-only-in-its-adapter',
      severity: 'error',
      comment: "'@openai/agents*' is imported only by src/openai-agents",
      from: { path: '^src/', pathNot: ['^src/openai-agents/'] },
      to: { path: 'node_modules/@openai/' },
    },
    {
      name: 'no-unresolvable',
      severity: 'error',
      from: {},
      to: { couldNotResolve: true },
    },
  ],
  options: {
    doNotFollow: { path: 'node_modules' },
    // node_modules only for the framework packages, which the rules above keep inside their adapters.
    includeOnly: ['^src/', '^node_modules/ai/', '^node_modules/@ai-sdk/', '^node_modules/@openai/', '^node_modules/@langchain/'],
    tsPreCompilationDeps: true,
    tsConfig: { fileName: 'tsconfig.json' },
    enhancedResolveOptions: {
      exportsFields: ['exports'],
      conditionNames: ['import', 'types', 'node', 'default'],
      extensions: ['.ts', '.js'],
    },
  },
};
