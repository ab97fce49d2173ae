/**
 * Calls a function once at the end of this turn of the event loop, however often it was
 * asked for during the turn. The group commits (worker/group-commit.ts, client/start-batch.ts)
 * send through it, so that everything submitted in one turn goes in one batch: the runs one
 * claim handed over reach their commits in the same turn, and so do the callers whose
 * results one commit delivered.
 */
export class EndOfTurn {
  private scheduled = false;

  constructor(private readonly fn: () => void) {}

  request(): void {
    if (this.scheduled) return;
    this.scheduled = true;
    setImmediate(() => {
      this.scheduled = false;
      this.fn();
    });
  }
}
