import { BaseSequencer, type TestSpecification } from 'vitest/node';

/**
 * Files known to take longest start first. On a fresh clone (CI) vitest has no timings from
 * an earlier run and starts files by size, so a long file could start last and run alone
 * while the other workers sit idle: the resume storm drill started after the restart and
 * failover drills made `npm run test:drills` take the sum of both slots (370 s on 2 cores)
 * instead of the longer one. The list is by measured duration, longest first; the other files
 * keep vitest's order after them.
 */
export function longestFirst(longest: readonly string[]): typeof BaseSequencer {
  return class LongestFirst extends BaseSequencer {
    override async sort(files: TestSpecification[]): Promise<TestSpecification[]> {
      const sorted = await super.sort(files);
      const rank = (file: TestSpecification) => {
        const index = longest.findIndex((suffix) => file.moduleId.endsWith(suffix));
        return index === -1 ? longest.length : index;
      };
      return [...sorted].sort((a, b) => rank(a) - rank(b));
    }
  };
}
