#!/usr/bin/env bash
# The package as a user installs it. From a fresh clone of this repository (its committed HEAD;
# dist/ is not committed), `npm pack` builds through `prepare` and writes a tarball; then two new
# ESM apps install runledger, one from that tarball and one with `npm install git+file://<clone>`,
# and each imports `createEngine` from 'runledger' at run time and type-checks a small file with tsc.
#
#   test/package/install-check.sh [REPO]     # REPO defaults to this checkout; .ci/run calls it
#
# Needs the npm registry (or its cache) for the apps' dependencies. Prints the tarball's size, its
# file count and the time taken; exits non-zero on the first failure.
set -euo pipefail
REPO="$(cd "${1:-$(dirname "$0")/../..}" && pwd)"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/runledger-install-check.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
started=$(date +%s)
quiet=(--no-audit --no-fund --loglevel=error --prefer-offline)
phase=$started
lap() { # seconds since the previous lap
  local now
  now=$(date +%s)
  echo "   ($((now - phase)) s)"
  phase=$now
}

echo "== fresh clone of $REPO at $(git -C "$REPO" rev-parse --short HEAD)"
git clone -q "$REPO" "$WORK/fresh"
[ ! -e "$WORK/fresh/dist" ] || { echo "dist/ is committed: a fresh clone must build it" >&2; exit 1; }

echo "== npm ci and npm pack in the clone (prepare builds dist/)"
(cd "$WORK/fresh" && npm ci "${quiet[@]}" --ignore-scripts >/dev/null)
(cd "$WORK/fresh" && npm pack --json --loglevel=error >"$WORK/pack.json" 2>"$WORK/pack.log") || { cat "$WORK/pack.log" >&2; exit 1; }
tarball="$WORK/fresh/$(node -e 'console.log(JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"))[0].filename)' "$WORK/pack.json")"
[ -f "$tarball" ] || { echo "npm pack wrote no tarball" >&2; exit 1; }
node -e '
const [pack] = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
const paths = pack.files.map((file) => file.path);
for (const need of ["dist/index.js", "dist/index.d.ts", "LICENSE", "README.md"]) if (!paths.includes(need)) { console.error(`the tarball has no ${need}`); process.exit(1); }
if (paths.some((path) => path.endsWith(".map"))) { console.error("the tarball ships source maps without their sources"); process.exit(1); }
console.log(`   ${pack.filename}: ${(pack.size / 1024).toFixed(0)} kB packed, ${(pack.unpackedSize / 1024).toFixed(0)} kB unpacked, ${pack.entryCount} files`);
' "$WORK/pack.json"
lap

# A user's file: the import resolves through package.json "exports" to dist/, its types to the .d.ts.
write_app() {
  local app="$1"
  mkdir -p "$app"
  (cd "$app" && npm init -y >/dev/null && npm pkg set type=module)
  cat >"$app/check.ts" <<'TS'
import { createEngine, type Engine } from 'runledger';

const engine: Engine = createEngine({ connectionString: process.env.DATABASE_URL });

const greet = engine.workflow({ name: 'greet' }, async (ctx, input: { name: string }) => {
  const text = await ctx.step('compose', async () => `hello, ${input.name}`);
  return { text };
});

export async function greetAda(): Promise<string> {
  await engine.migrate();
  const handle = await engine.start(greet, { name: 'Ada' });
  const { text } = await handle.result();
  return text;
}
TS
  cat >"$app/run.mjs" <<'JS'
import { createEngine } from 'runledger';
if (typeof createEngine !== 'function') throw new Error('createEngine is not a function');
console.log('   import { createEngine } from "runledger": ok');
JS
  cat >"$app/tsconfig.json" <<'JSON'
{
  "compilerOptions": {
    "target": "ES2022",
    "module": "NodeNext",
    "moduleResolution": "NodeNext",
    "strict": true,
    "noEmit": true,
    "skipLibCheck": false,
    "types": ["node"]
  },
  "files": ["check.ts"]
}
JSON
}

check_app() {
  local app="$1"
  (cd "$app" && node run.mjs)
  (cd "$app" && npx tsc -p tsconfig.json)
  echo "   tsc type-checks a file that imports runledger: ok"
}

app_tarball() {
  echo "== app 1: npm install <tarball>"
  write_app "$WORK/app-tarball"
  # ai, zod and @types/json-schema for check_ai_app below, in the same install (one resolution).
  (cd "$WORK/app-tarball" && npm install "${quiet[@]}" "$tarball" typescript@5 @types/node@20 ai@7 zod@4 @types/json-schema >/dev/null)
  check_app "$WORK/app-tarball"
  check_ai_app "$WORK/app-tarball"
}

# A user of the AI SDK: runledger/ai resolves with its types once `ai` is installed beside runledger (an optional peer).
check_ai_app() {
  local app="$1"
  cat >"$app/check-ai.ts" <<'TS'
import { generateText, tool } from 'ai';
import { MockLanguageModelV4 } from 'ai/test';
import { z } from 'zod';
import { createEngine } from 'runledger';
import { durableModel, durableTools } from 'runledger/ai';

const engine = createEngine({ connectionString: process.env.DATABASE_URL });
export const agent = engine.workflow({ name: 'agent' }, async (ctx, input: { prompt: string }) => {
  const result = await generateText({
    model: durableModel(ctx, new MockLanguageModelV4()),
    tools: durableTools(ctx, { echo: tool({ inputSchema: z.object({ text: z.string() }), execute: async ({ text }) => text }) }),
    prompt: input.prompt,
  });
  return result.text;
});
TS
  cat >"$app/run-ai.mjs" <<'JS'
import { durableModel } from 'runledger/ai';
if (typeof durableModel !== 'function') throw new Error('durableModel is not a function');
console.log('   import { durableModel } from "runledger/ai": ok');
JS
  # Installed with the app (app_tarball): ai, zod, and @types/json-schema, which the AI SDK's own
  # declarations need when libraries are type-checked too (skipLibCheck false).
  (cd "$app" && node run-ai.mjs)
  (cd "$app" && node -e 'const fs = require("fs"); const c = JSON.parse(fs.readFileSync("tsconfig.json", "utf8")); c.files = ["check-ai.ts"]; fs.writeFileSync("tsconfig.ai.json", JSON.stringify(c, null, 2));')
  (cd "$app" && npx tsc -p tsconfig.ai.json)
  echo "   tsc type-checks a file that imports runledger/ai with ai installed: ok"
}

app_git() {
  echo "== app 2: npm install git+file://<fresh clone> (npm clones it, installs its dev dependencies and runs prepare)"
  write_app "$WORK/app-git"
  (cd "$WORK/app-git" && npm install "${quiet[@]}" "git+file://$WORK/fresh" typescript@5 @types/node@20 >/dev/null)
  [ -f "$WORK/app-git/node_modules/runledger/dist/index.js" ] || { echo "the git install has no dist/index.js" >&2; exit 1; }
  check_app "$WORK/app-git"
}

# The two apps install side by side (mostly waiting on npm); each one's output is shown
# whole, in order, and either failing fails the check.
(set -e; app_tarball) >"$WORK/app-tarball.log" 2>&1 &
tarball_pid=$!
(set -e; app_git) >"$WORK/app-git.log" 2>&1 &
git_pid=$!
status=0
wait "$tarball_pid" || status=1
cat "$WORK/app-tarball.log"
wait "$git_pid" || status=1
cat "$WORK/app-git.log"
[ "$status" -eq 0 ] || { echo "an app failed to install or type-check runledger" >&2; exit 1; }
lap

echo "== install check passed in $(($(date +%s) - started)) s"
