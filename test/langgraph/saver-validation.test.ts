import { validate } from '@langchain/langgraph-checkpoint-validation';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it, test } from 'vitest';
import { RunledgerSaver } from '../../src/langgraph/index.js';
import { useTestEngine } from '../helpers/test-engine.js';

/**
 * LangGraph's own judge of a checkpointer: @langchain/langgraph-checkpoint-validation's
 * suite, unmodified, against RunledgerSaver on a migrated runledger database. The suite
 * calls vitest's describe/it/expect as globals (its package runs them with globals on), so
 * they are handed to it here; its CLI is broken in 1.1.1, validate() is the documented way in.
 */
Object.assign(globalThis, { describe, it, test, expect, beforeAll, afterAll, beforeEach, afterEach });
const t = useTestEngine({ engine: false });

validate({
  checkpointerName: 'RunledgerSaver',
  // Each checkpointer starts empty, as the suite expects (its list tests count every tuple stored).
  createCheckpointer: async () => {
    await t.db.pool.query('truncate runledger.graph_checkpoints, runledger.graph_blobs, runledger.graph_writes');
    return new RunledgerSaver(t.db.pool);
  },
  destroyCheckpointer: async () => {},
});
