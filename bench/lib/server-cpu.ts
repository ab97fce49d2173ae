import { readFileSync, readdirSync } from 'node:fs';

/**
 * CPU ticks (1/100 s, user + system) of a PostgreSQL server running on this machine: its
 * postmaster and every child (backends, WAL writer, checkpointer...), read from /proc.
 * A process that ends between two readings takes its ticks with it, so keep the
 * connections open across a measurement.
 */
export function serverCpuTicks(postmaster: number): number {
  const pids = [postmaster];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      if (Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]) === postmaster) pids.push(Number(entry));
    } catch {
      // the process ended meanwhile
    }
  }
  let ticks = 0;
  for (const pid of pids) {
    try {
      const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
      const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      ticks += Number(fields[11]) + Number(fields[12]); // utime, stime
    } catch {
      // the process ended meanwhile
    }
  }
  return ticks;
}
