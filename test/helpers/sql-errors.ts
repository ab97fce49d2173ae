/** The SQLSTATE a statement raised; throws when it succeeded, so a test cannot pass by accident. */
export async function sqlState(promise: Promise<unknown>): Promise<string | undefined> {
  try {
    await promise;
  } catch (error) {
    return (error as { code?: string }).code;
  }
  throw new Error('expected the statement to raise, but it succeeded');
}

/** The SQLSTATE and constraint name of a statement's error (it must fail). */
export async function checkViolation(promise: Promise<unknown>): Promise<{ code?: string; constraint?: string }> {
  try {
    await promise;
  } catch (error) {
    const e = error as { code?: string; constraint?: string };
    return { code: e.code, constraint: e.constraint };
  }
  throw new Error('expected a check violation, but the statement succeeded');
}
