#!/usr/bin/env bash
# bench/instructions.sh: server instructions per started run, counted by callgrind, for
# runledger's start_runs (per row) and start_run (per call) and graphile-worker's add_jobs
# (per job) and add_job (per call); and per drained run, runledger's group commit
# completing claimed one-step runs and claiming the next, in batches of 16 (DRAIN_BATCH=1:
# batches of one, a worker running one run at a time).
#
# Why instructions: on a shared 2-core machine the wall-clock rate of the same build swings
# by 30 % and more between runs, and a change worth 10 % cannot be seen. Instructions
# counted by valgrind are the same for the same binary, data and statement, whatever else
# the machine does. Each figure is a difference of two runs (N and 6N calls, or 1 and 3
# batches of 1,000) of one single-user backend, so the cost of starting the backend
# cancels out.
#
# Usage (from bench/, after npm ci here and npm run build at the root):
#   ./instructions.sh                      # this checkout's build
#   RUNLEDGER_ROOT=/path/to/other/checkout ./instructions.sh   # another build (its dist/ and sql/)
#   PG_BIN=/usr/lib/postgresql/15/bin ./instructions.sh         # the PostgreSQL binaries to count
#   DRAIN_ONLY=1 DRAIN_BATCH=1 ./instructions.sh               # only the drained run, in batches of one
# Needs valgrind, and PostgreSQL server binaries (initdb, pg_ctl, postgres). Runs as root
# with a postgres user (as on the CI machines) or as any other non-root user. A throw-away
# cluster on port 5499 in a temporary folder; nothing else is touched. About 8 minutes.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="${RUNLEDGER_ROOT:-$(cd "$HERE/.." && pwd)}"
PG_BIN="${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)}"
PORT="${PORT:-5499}"
# The cluster's locale (initdb --locale): C.UTF-8, as on these machines' PostgreSQL 15 server.
LOCALE="${LOCALE:-C.UTF-8}"
command -v valgrind >/dev/null || { echo "instructions.sh: valgrind is not installed (apt-get install valgrind)" >&2; exit 2; }
[ -x "$PG_BIN/postgres" ] || { echo "instructions.sh: no PostgreSQL server binaries in PG_BIN=$PG_BIN" >&2; exit 2; }
[ -f "$ROOT/dist/engine/db/migrate.js" ] || { echo "instructions.sh: $ROOT/dist is missing (npm run build there)" >&2; exit 2; }

WORK="$(mktemp -d /tmp/runledger-instructions.XXXXXX)"
# The server refuses to run as root: as root, the cluster belongs to the postgres user.
if [ "$(id -u)" = 0 ]; then AS=(su postgres -s /bin/bash -c); chown postgres "$WORK"; else AS=(bash -c); fi
DATA="$WORK/data"
SETUP="$HERE/.instructions-setup.mjs"
# Whatever step fails: the server stopped, the cluster and the set-up script removed.
cleanup() { "${AS[@]}" "$PG_BIN/pg_ctl -D $DATA stop -m immediate -w" >/dev/null 2>&1 || true; rm -rf "$WORK" "$SETUP"; }
trap cleanup EXIT

step() { echo "[instructions] $*" >&2; }
step "cluster in $WORK (PostgreSQL binaries $PG_BIN), runledger from $ROOT"
"${AS[@]}" "$PG_BIN/initdb -D $DATA -U postgres --locale=$LOCALE -A trust" >/dev/null
printf "port = %s\nunix_socket_directories = '%s'\nlisten_addresses = '127.0.0.1'\nautovacuum = off\n" "$PORT" "$WORK" >> "$DATA/postgresql.conf"
"${AS[@]}" "$PG_BIN/pg_ctl -D $DATA -l $WORK/server.log start -w" >/dev/null
URL="postgres://postgres@127.0.0.1:$PORT"
psql -q "$URL/postgres" -c 'create database rl' -c 'create database gw'

step "migrating runledger and graphile-worker"
cat > "$SETUP" <<EOF
import pg from 'pg';
import { runMigrations } from 'graphile-worker';
import { migrate } from '$ROOT/dist/engine/db/migrate.js';
const pool = new pg.Pool({ connectionString: '$URL/rl' });
pool.on('error', () => {});
await migrate(pool);
await pool.query("insert into runledger.workflows (workflow_name, workflow_version, queue_name, max_recovery_attempts) values ('bulk', 'v1', 'default', 10)");
await pool.end();
await runMigrations({ connectionString: '$URL/gw' });
EOF
(cd "$HERE" && node "$SETUP")
"${AS[@]}" "$PG_BIN/pg_ctl -D $DATA stop -w" >/dev/null

# Instructions of one single-user backend running one statement on a fresh copy of $1.
count() {
  local template=$1 sql=$2
  printf 'drop database if exists counted\ncreate database counted template %s\n' "$template" \
    | "${AS[@]}" "$PG_BIN/postgres --single -D $DATA postgres" >/dev/null 2>&1
  echo "$sql" | "${AS[@]}" "valgrind --tool=callgrind --callgrind-out-file=$WORK/callgrind.%p $PG_BIN/postgres --single -D $DATA counted" \
    2>"$WORK/valgrind.log" >"$WORK/out.log"
  grep -o 'Collected : [0-9]*' "$WORK/valgrind.log" | awk '{print $3}'
}
per() { echo $(( ($2 - $1) / $3 )); }

rl_series() { echo "select count(*) from (select runledger.start_run('bulk', jsonb_build_object('n', g), '{\"notify\":false}') from generate_series(1,$1) g) x;"; }
rl_batches() { echo "select count(*) from (select cardinality(runledger.start_runs('bulk', (select jsonb_agg(jsonb_build_object('n', g, 'b', b)) from generate_series(1,1000) g))) from generate_series(1,$1) b) x;"; }
gw_series() { echo "select count(graphile_worker.add_job('t', json_build_object('n', i, 's', 0))) from generate_series(1,$1) i;"; }
gw_batches() { echo "select count(*) from (select (select count(*) from graphile_worker.add_jobs(array(select row('t', json_build_object('n', n, 's', b), null, null, null, null, null, null)::graphile_worker.job_spec from generate_series(1,1000) n))) from generate_series(1,$1) b) x;"; }

# DRAIN_ONLY=1 counts only the drained run and engine.start's _start_many (under a minute).
if [ -z "${DRAIN_ONLY:-}" ]; then
step "runledger start_runs (batches of 1,000)"
RL_ROW=$(per "$(count rl "$(rl_batches 1)")" "$(count rl "$(rl_batches 3)")" 2000)
step "runledger start_run"
RL_CALL=$(per "$(count rl "$(rl_series 100)")" "$(count rl "$(rl_series 600)")" 500)
step "graphile-worker add_jobs (batches of 1,000)"
GW_ROW=$(per "$(count gw "$(gw_batches 1)")" "$(count gw "$(gw_batches 3)")" 2000)
step "graphile-worker add_job"
GW_CALL=$(per "$(count gw "$(gw_series 100)")" "$(count gw "$(gw_series 600)")" 500)
fi

# A drained run: what a worker's group commit costs the server to complete a claimed
# one-step run and claim the next, in batches of 16 (concurrency 16). Each statement
# commits the batch the statement before it claimed and claims the next 16, through
# _commit_and_claim with the claimed runs in columns (named _commit_and_claim_flat in builds
# before 0.2.0; in the oldest builds only the JSON form exists); the table
# claimed carries the claim from one statement to the next. The items are built in SQL,
# the same way for every build (the worker builds them as JSON text).
BATCH_SIZE="${DRAIN_BATCH:-16}"
step "runledger: claimed and completed one-step runs (batches of $BATCH_SIZE)"
single() { "${AS[@]}" "$PG_BIN/postgres --single -D $DATA $1" 2>/dev/null; }
printf 'drop database if exists drain\ncreate database drain template rl\n' | single postgres >/dev/null
# The runs table analysed once loaded, as autovacuum leaves a user's queue that holds runs:
# PL/pgSQL's choice between a generic and a custom plan follows those statistics (a claim
# planned on every call shows only on a table the statistics know is not small).
printf '%s\n' "create table public.claimed (run_id text, token text)" \
  "select count(*) from (select runledger.start_runs('bulk', (select jsonb_agg(jsonb_build_object('n', g)) from generate_series(1,1000) g)) from generate_series(1,${DRAIN_RUNS_K:-20})) x" \
  "analyze runledger.runs" \
  | single drain >/dev/null
POLICY=$(echo "select policy_version from runledger.runs limit 1" | single drain | grep -o 'policy_version = "[^"]*"' | cut -d'"' -f2)
ITEMS="select coalesce(jsonb_agg(jsonb_build_object('op','complete','run_id',run_id,'token',token,'seq',0,'name','only','kind','step','status','SUCCEEDED','step_output',1,'attempts',1,'started_ms_ago',0,'output',null,'policy_version','$POLICY'::text)), '[]') as j from claimed"
FLAT_FN=$(echo "select coalesce((select proname from pg_proc where proname = '_commit_and_claim_flat'), (select proname from pg_proc where proname = '_commit_and_claim' and not 'claimed' = any(proargnames)), 'none') as f" | single drain | grep -o 'f = "[^"]*"' | cut -d'"' -f2)
if [ "$FLAT_FN" != none ]; then
  BATCH="with items as ($ITEMS), cc as (select c.* from items, runledger.${FLAT_FN}(items.j, 'w1', array['default'], array['bulk@v1'], $BATCH_SIZE, 30000) c), d as (delete from claimed), ins as (insert into claimed select cc.run_id, cc.fencing_token::text from cc where cc.item is null and cc.run_id is not null returning 1) select (select count(*) from cc where code is not null) as failed, (select count(*) from ins) as claimed;"
else
  BATCH="with items as ($ITEMS), cc as (select c.* from items, runledger._commit_and_claim(items.j, 'w1', array['default'], array['bulk@v1'], $BATCH_SIZE, 30000) c), d as (delete from claimed), ins as (insert into claimed select cc.claimed->>'run_id', cc.claimed->>'fencing_token' from cc where cc.claimed->>'run_id' is not null returning 1) select (select count(*) from cc where code is not null) as failed, (select count(*) from ins) as claimed;"
fi
batches() { for _ in $(seq 1 "$1"); do echo "$BATCH"; done; }
DRAIN_11=$(count drain "$(batches 11)")
DRAIN_51=$(count drain "$(batches 51)")
# Every statement must have claimed a full batch and failed no item, or the figure counts something else.
if [ "$(grep -c "claimed = \"$BATCH_SIZE\"" "$WORK/out.log")" != 51 ] || grep -q 'failed = "[1-9]' "$WORK/out.log"; then
  echo "instructions.sh: a drain statement failed an item or claimed fewer than $BATCH_SIZE runs:" >&2
  grep -E 'ERROR|failed = |claimed = ' "$WORK/out.log" | sort | uniq -c >&2
  exit 1
fi
RL_DRAIN=$(per "$DRAIN_11" "$DRAIN_51" $((40 * BATCH_SIZE)))

# engine.start in a process whose worker has free slots: _start_many with BATCH_SIZE items,
# each inserted already claimed for that worker (the closed loop's other statement).
step "runledger: engine.start through _start_many, claimed at insert (batches of $BATCH_SIZE)"
rl_many() { echo "select count(*) from (select (select count(*) from runledger._start_many((select jsonb_agg(jsonb_build_object('workflow', 'bulk', 'input', jsonb_build_object('n', g, 'b', b), 'options', '{}'::jsonb, 'worker_id', 'w1', 'lease_ms', 30000)) from generate_series(1, $BATCH_SIZE) g))) from generate_series(1, $1) b) x;"; }
RL_MANY=$(per "$(count rl "$(rl_many 20)")" "$(count rl "$(rl_many 120)")" $((100 * BATCH_SIZE)))

if [ -z "${DRAIN_ONLY:-}" ]; then
echo "| server instructions per started run ($("$PG_BIN/postgres" --version)) | runledger ($(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')) | graphile-worker | graphile-worker ÷ runledger |"
echo "| --- | ---: | ---: | ---: |"
echo "| a row of a batch of 1,000 (start_runs / add_jobs) | $RL_ROW | $GW_ROW | $(awk "BEGIN { printf \"%.2f\", $GW_ROW / $RL_ROW }") |"
echo "| one call (start_run with notify false / add_job) | $RL_CALL | $GW_CALL | $(awk "BEGIN { printf \"%.2f\", $GW_CALL / $RL_CALL }") |"
fi
echo
echo "| server instructions per drained run ($("$PG_BIN/postgres" --version)) | runledger ($(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')) |"
echo "| --- | ---: |"
echo "| a one-step run claimed and completed by a group commit with a claim, batches of $BATCH_SIZE (a table of ${DRAIN_RUNS_K:-20},000 runs, analysed) | $RL_DRAIN |"
echo "| a run started and claimed for its worker (engine.start: _start_many), batches of $BATCH_SIZE | $RL_MANY |"
