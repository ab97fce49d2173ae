import { it } from 'vitest';
import { useTestEngine } from '../helpers/test-engine.js';
import { resumeStorm } from '../helpers/resume-storm.js';

// The full-size resume storm (issue 18): 100,000 waiting runs, one signalling statement. Slow on
// two cores (parking and draining at roughly 100-300 runs a second), so it lives in the drills suite.
const t = useTestEngine({ fixtures: true });

it(
  '100,000 waiting runs signalled by one statement: RUNNING within the slots and the queue limit, connections bounded, all finish once',
  async () => {
    const figures = await resumeStorm(t, { runs: Number(process.env.STORM_RUNS ?? 100_000), timeoutMs: 3 * 3_600_000 });
    console.log(`resume storm: ${JSON.stringify(figures)}`);
  },
  7 * 3_600_000,
);
