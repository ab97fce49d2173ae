import { it } from 'vitest';
import { useTestEngine } from './helpers/test-engine.js';
import { resumeStorm } from './helpers/resume-storm.js';

// The resume storm at the normal suite's size; test/drills/resume-storm.test.ts is the full 100,000.
const t = useTestEngine({ fixtures: true });

it('2,000 waiting runs signalled by one statement: RUNNING within the slots and the queue limit, connections bounded, all finish once', async () => {
  const figures = await resumeStorm(t, { runs: 2_000, timeoutMs: 120_000 });
  console.log(`resume storm: ${JSON.stringify(figures)}`);
}, 300_000);
