/**
 * Test-only crash points. `RUNLEDGER_FAILPOINTS=before-checkpoint:charge,after-commit:*`
 * makes the process SIGKILL itself when it reaches that point for that step name.
 * Read once at start; with the variable unset every call is a cheap no-op.
 */
export type FailpointName =
  | 'before-checkpoint'
  | 'after-commit'
  | 'in-step'
  | 'before-complete'
  | 'after-compensation'
  /** A group commit batch committed, before its items hear so; matched by 'batch' (several items) or 'single'. */
  | 'after-group-commit';

const armed: ReadonlyArray<{ point: string; match: string }> = (process.env.RUNLEDGER_FAILPOINTS ?? '')
  .split(',')
  .map((entry) => entry.trim())
  .filter(Boolean)
  .map((entry) => {
    const [point, match = '*'] = entry.split(':');
    return { point: point!, match };
  });

export function failpoint(point: FailpointName, stepName: string): void {
  if (armed.length === 0) return;
  if (armed.some((fp) => fp.point === point && (fp.match === '*' || fp.match === stepName))) {
    process.kill(process.pid, 'SIGKILL');
  }
}
