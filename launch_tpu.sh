#!/usr/bin/env bash
# launch_tpu.sh: create a Cloud TPU VM pod, ship the committed tree to every
# worker, and run the same ada_jax main job on all of them (plain
# multi-controller JAX, no Pathways). `./launch_tpu.sh -h` for usage.
#
# Why the shape of this script (see shared/docs/jax_rl_anchors.md section 6):
# - Every worker must run the same code and the same command, or the hosts
#   issue different collectives and hang: `setup` ships `git archive HEAD`
#   (never the dirty tree) and `run` starts one command with --worker=all.
# - A stale process that still holds the TPU makes the next job fail ("TPU
#   already in use"): `run` refuses to start on a pod where anything holds it,
#   and `stop` waits for the job and then kills its whole process group.
# - Spot/preemptible VMs lose their disks: the workdir (checkpoints, metrics)
#   and the compilation cache live on GCS, so a new pod resumes with the same
#   `run` command.
set -euo pipefail
# Runs on macOS bash 3.2 too: arrays that may be empty expand as ${a[@]+"${a[@]}"}.

# Pinned TPU install, apart from requirements.txt (which stays CPU-safe).
# libtpu comes from PyPI with jax[tpu] since JAX 0.4.3x; set
# LIBTPU_FIND_LINKS only for libtpu builds that are not on PyPI.
JAX_TPU_VERSION="0.10.2"
GCSFS_VERSION="2026.10.1"  # needs fsspec>=2026.9.0, the version requirements.txt pins.
LIBTPU_FIND_LINKS="${LIBTPU_FIND_LINKS:-}"

# Paths on the workers, expanded there: every remote script starts with them.
WORKER_PATHS=$(cat <<'EOF'
CODE_DIR=$HOME/ada_jax
VENV=$HOME/ada_venv
LOG_DIR=$HOME/ada_logs
PID_FILE=$HOME/ada_logs/job.pid
RC_FILE=$HOME/ada_logs/job.rc
EOF
)

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# Options: flags override environment variables, which override defaults.
TPU_NAME="${ADA_TPU_NAME:-}"
ZONE="${ADA_TPU_ZONE:-${CLOUDSDK_COMPUTE_ZONE:-}}"
PROJECT="${ADA_TPU_PROJECT:-${CLOUDSDK_CORE_PROJECT:-}}"
TPU_TYPE="${ADA_TPU_TYPE:-}"
TPU_VERSION="${ADA_TPU_VERSION:-}"
WORKDIR="${ADA_WORKDIR:-}"
CACHE_DIR="${ADA_CACHE_DIR:-}"
TARBALL=""
DRY_RUN=0 SPOT=0 PREEMPTIBLE=0 ALLOW_DIRTY=0 NO_CHECK=0 IGNORE_PLAN=0 FORCE=0 YES=0 FOLLOW=1
WORKER="" LINES=100 GRACE=600
EXTRA_ENV=() REST=()

usage() {
  cat <<'EOF'
Usage: ./launch_tpu.sh [options] COMMAND [args]

Commands:
  create                 create the TPU VM (--type, --version, --spot|--preemptible);
                         args after `--` go to `gcloud ... create` (e.g. --network=N)
  setup [CONFIG[:ARGS]]  ship the committed tree (git archive HEAD) to every worker,
                         make a venv, install requirements.txt + pinned jax[tpu] + the
                         reference graders' extra (math_verify),
                         then the pod check on every worker (one line each): the
                         config's mesh builds on the chips, each host feeds its
                         rows, the plan fits (default config: qwen25_math_1p5b,
                         with tpu=TYPE when --type is given)
  stage ARGS...          here, on a machine with internet: `python -m ada_jax.stage ARGS...`
                         downloads a paper config's model and its prompt and evaluation
                         sets once into a bucket (--config CONFIG --to gs://BUCKET/DIR;
                         a gated model needs HF_TOKEN) and prints the --config.* overrides
                         that read them from there on every worker
  run CONFIG[:ARGS] [--config.key=value ...]
                         start `python -m ada_jax.main --config CONFIG[:ARGS]
                         --workdir gs://...` on every worker (nohup; log, pid file and
                         exit-code file per worker; ADA_DISTRIBUTED=1, persistent
                         compilation cache); CONFIG is configs/NAME.py or just NAME.
                         First checked here (also with --dry-run; python -m
                         ada_jax.plan --launch-check): the config, its ARGS and each
                         --config.key load, the config rules pass on the pod's chips
                         (tpu= in ARGS, else --type; a paper model's files stood in
                         by its config.json from the planner), and the plan fits; if
                         not, one line (the plan's, with its smallest change) and
                         nothing is sent. Python used: $ADA_PYTHON, else
                         REPO/.venv/bin/python, else python3 (the first with jax and
                         ml_collections; none: a warning, unchecked). Then the pod
                         check on every worker (as setup's, and the programs
                         compiled at 2 layers on the chips) before the job starts; a
                         failure is one line per worker and nothing starts
  eval ARGS...           start `python -m ada_jax.evaluate ARGS...` on every worker, like
                         run (log, pid file, exit code, status, stop): ARGS are evaluate's
                         own (--config, --checkpoint gs://RUN or gs://HF_DIR, --step
                         N|latest|all, --out gs://..., --config.key=value), checked here
                         first like run's, by the plan's line for evaluate (its largest
                         chunk that fits: refused when not even the smallest does);
                         launcher options go before `eval`
  export ARGS...         the same for `python -m ada_jax.export ARGS...` (--workdir
                         gs://RUN, --out gs://HF_DIR, --step N|latest)
  logs                   tail the log of worker 0 (or --worker N|all)
  status                 TPU state (READY, PREEMPTED...) and, per worker, its code
                         commit, the job and the log's last line. The job: `running
                         pid N`, `no job`, or how it ended, from its exit code:
                           exit 0: finished
                           exit 75: stopped after a checkpoint: resumable (run again
                             with the same --workdir)
                           exit 73: busy: another live process holds the --workdir
                           failed (exit N): see logs   (any other code)
                         then which job it is (its log's name: RUN.STAMP, eval.RUN.STAMP,
                         export.RUN.STAMP)
  stop                   SIGTERM the job on every worker (it checkpoints, then exits
                         75), SIGKILL after --grace seconds; --force kills at once
  delete                 delete the TPU VM (gcloud asks; --yes does not)
  ssh -- CMD...          run CMD on every worker (or --worker N), e.g. to copy weights

Options (environment variable in brackets):
  --name NAME            TPU name [ADA_TPU_NAME]                         (required)
  --zone ZONE            zone [ADA_TPU_ZONE, CLOUDSDK_COMPUTE_ZONE]      (required)
  --project PROJECT      project [ADA_TPU_PROJECT, CLOUDSDK_CORE_PROJECT]
                         (default: gcloud's configured project)
  --type TYPE            accelerator type, e.g. v4-32, v5p-64, v6e-64 [ADA_TPU_TYPE]
                         (required by create; elsewhere only prints the worker count)
  --version VERSION      runtime version [ADA_TPU_VERSION] (default by type:
                         v4 tpu-ubuntu2204-base, v5p v2-alpha-tpuv5,
                         v5litepod v2-alpha-tpuv5-lite, v6e v2-alpha-tpuv6e)
  --spot | --preemptible create a spot (or legacy preemptible) TPU
  --workdir gs://B/DIR   run: checkpoints + metrics; the same workdir resumes [ADA_WORKDIR]
  --cache-dir DIR        run/eval/export: JAX persistent compilation cache, gs:// or a
                         local path on the workers [ADA_CACHE_DIR] (default:
                         WORKDIR/jax_cache; eval: CHECKPOINT/jax_cache)
  --env KEY=VALUE        run/eval/export: extra environment variable for the job
                         (repeatable; the value is never printed)
  --allow-dirty          setup: ship HEAD even with uncommitted changes (not shipped)
  --no-check             setup: skip the all-workers pod check
  --ignore-plan          setup/run/eval: a plan that does not fit the chips is a
                         warning, here and in the pod check, not a refusal (a
                         layout left to the rule, at 0, that fits nowhere is still
                         refused: the job refuses it; set the keys the refusal names)
  --worker N|all         logs/ssh: which worker (logs default 0, ssh default all)
  --lines N, --no-follow logs: tail N lines (default 100); do not follow
  --grace SECONDS        stop: wait this long for the checkpoint before SIGKILL (600)
  --force                stop: SIGKILL at once
  --yes                  delete: do not ask
  --dry-run              print every command (gcloud, git) instead of running it
  -h, --help             this text

Example (v4-32 = 4 workers x 4 chips):
  export ADA_TPU_NAME=ada-v4 ADA_TPU_ZONE=us-central2-b
  ./launch_tpu.sh --type v4-32 --spot create
  ./launch_tpu.sh setup
  ./launch_tpu.sh run tiny_arith --workdir gs://my-bucket/ada/tiny
  ./launch_tpu.sh logs; ./launch_tpu.sh stop; ./launch_tpu.sh delete
EOF
}

die() { echo "launch_tpu.sh: error: $*" >&2; exit 1; }
note() { echo "# $*"; }

# Quote one word for bash only when it needs it, so that dry-run output stays
# readable (printf %q escapes commas: tpu=v4-32\,variant=...) and still pastes.
sq() {
  if [[ $1 =~ ^[A-Za-z0-9_./:=,@%+-]+$ ]]; then printf '%s' "$1"
  else printf "'%s'" "${1//\'/\'\\\'\'}"; fi
}

# A multi-line remote script prints as a quoted here-document: valid bash,
# and it reads as the script the workers run.
# The values given with --env never print (they are often tokens).
show_cmd() {
  local out=() a e line nl=$'\n'
  for a in "$@"; do
    for e in ${EXTRA_ENV[@]+"${EXTRA_ENV[@]}"}; do
      line="export ${e%%=*}=$(sq "${e#*=}")"
      a=${a//"$line"/"export ${e%%=*}='<hidden>'"}
    done
    if [[ $a =~ ^(--[A-Za-z0-9-]+=)(.*)$ && $a == *"$nl"* ]]; then
      out+=("${BASH_REMATCH[1]}\"\$(cat <<'REMOTE'$nl${BASH_REMATCH[2]}${nl}REMOTE$nl)\"")
    elif [[ $a =~ ^(--[A-Za-z0-9-]+=)(.*)$ ]]; then
      out+=("${BASH_REMATCH[1]}$(sq "${BASH_REMATCH[2]}")")
    else out+=("$(sq "$a")"); fi
  done
  printf '+ %s\n' "${out[*]}"
}

# Every external command goes through here: --dry-run prints instead.
x() {
  show_cmd "$@"
  (( DRY_RUN )) || "$@"
}

# Workers and chips per worker of an accelerator type. The number in the
# name counts TensorCores for v2-v5p (2 per chip on v4/v5p, 4 chips per VM)
# and chips for v5e/v6e (one VM up to 8 chips, 4-chip VMs beyond).
topology() {
  local gen=${1%-*} n=${1##*-}
  [[ $n =~ ^[0-9]+$ ]] || return 1
  case $gen in
    v2|v3|v4|v5p) echo "$(( n > 8 ? n / 8 : 1 )) $(( n > 8 ? 4 : n / 2 ))" ;;
    v5litepod|v5e|v6e) if (( n <= 8 )); then echo "1 $n"; else echo "$(( n / 4 )) 4"; fi ;;
    *) return 1 ;;
  esac
}

default_version() {
  case ${1%-*} in
    v2|v3|v4) echo tpu-ubuntu2204-base ;;
    v5p) echo v2-alpha-tpuv5 ;;
    v5litepod|v5e) echo v2-alpha-tpuv5-lite ;;
    v6e) echo v2-alpha-tpuv6e ;;
    *) return 1 ;;
  esac
}

describe_pod() {
  local topo w c
  [[ -n $TPU_TYPE ]] || { note "TPU $TPU_NAME ($ZONE); pass --type to see its worker count"; return; }
  topo=$(topology "$TPU_TYPE") || die "unknown accelerator type '$TPU_TYPE' (e.g. v4-32, v5p-64, v6e-64)"
  read -r w c <<<"$topo"
  local label=workers
  (( w > 1 )) || label=worker
  note "TPU $TPU_NAME ($ZONE): $TPU_TYPE = $w $label x $c chips ($(( w * c )) chips)"
}

require() {
  [[ -n $TPU_NAME ]] || die "no TPU name: pass --name NAME or set ADA_TPU_NAME"
  [[ -n $ZONE ]] || die "no zone: pass --zone ZONE or set ADA_TPU_ZONE (e.g. us-central2-b for v4)"
  LOC=(--zone="$ZONE")
  [[ -z $PROJECT ]] || LOC+=(--project="$PROJECT")
}

ssh_workers() {  # WORKER SCRIPT
  x gcloud compute tpus tpu-vm ssh "$TPU_NAME" "${LOC[@]}" --worker="$1" --command="$2"
}

# A remote script: variable assignments (quoted here), then a fixed body.
remote() {
  printf 'set -euo pipefail\n%s\n' "$WORKER_PATHS"
  while (( $# > 1 )); do printf '%s=%s\n' "$1" "$(sq "$2")"; shift 2; done
  cat
}

# Shared by setup and run: nothing may hold the TPU, or the new job dies
# with "TPU already in use" on that worker while the others wait forever.
TPU_FREE_CHECK=$(cat <<'EOF'
if [[ -f $PID_FILE ]] && kill -0 "$(cat "$PID_FILE")" 2>/dev/null; then
  echo "$(hostname): job $(cat "$PID_FILE") is running; ./launch_tpu.sh stop first" >&2; exit 1
fi
holders=$(sudo lsof -t /dev/accel* /dev/vfio/[0-9]* 2>/dev/null | sort -u | tr "\n" " " || true)
if [[ -n ${holders// /} ]]; then
  echo "$(hostname): the TPU is held by pid(s) $holders(a leftover process?); kill them first" >&2; exit 1
fi
EOF
)

# Shared by status and stop: how the job ended, from the exit code its
# wrapper (JOB_WRAPPER) wrote; the codes are ada_jax/exit_codes.py's.
JOB_ENDED=$(cat <<'EOF'
job_ended() {
  local rc
  rc=$(cat "$RC_FILE" 2>/dev/null)
  case $rc in
    "") echo "ended, exit code not recorded: see logs" ;;
    0) echo "exit 0: finished" ;;
    73) echo "exit 73: busy: another live process holds this --workdir (its lease names it): nothing written" ;;
    75) echo "exit 75: stopped after a checkpoint: resumable (run again with the same --workdir)" ;;
    *) echo "failed (exit $rc): see logs" ;;
  esac
}
EOF
)

# What `run` starts on each worker, as `bash -c "$JOB_WRAPPER" job PID_FILE
# RC_FILE CMD...`: set -m starts CMD in a process group of its own, led by
# CMD itself, so PID_FILE holds the python job's pid, the one stop sends
# SIGTERM to and whose group (the verifier pool too) it SIGKILLs. This shell
# stays outside that group, waits, and writes CMD's exit code to RC_FILE (75:
# stopped after a checkpoint; 137: SIGKILL). A signal to this shell only
# (a shutdown reaches every process) does not stop it waiting.
JOB_WRAPPER=$(cat <<'EOF'
set -m
pid_file=$1 rc_file=$2
shift 2
signalled=0
trap 'signalled=1' TERM INT HUP
"$@" &
pid=$!
# CMD keeps the log as its stderr; this shell's job notices ("[1]+ Exit 75")
# would be the log's last line, which status shows.
exec 2>/dev/null
echo "$pid" > "$pid_file.tmp" && mv "$pid_file.tmp" "$pid_file"
wait "$pid"; rc=$?
# A trapped signal ends `wait` early; once CMD has ended, wait gives its code.
while (( signalled )); do signalled=0; wait "$pid"; rc=$?; done
echo "$rc" > "$rc_file.tmp" && mv "$rc_file.tmp" "$rc_file"
EOF
)

# The check here, before anything is sent to the workers (`python -m
# ada_jax.plan --launch-check COMMAND ...`): the config as the job loads it,
# the config rules (the workers' model files stood in by the paper model's
# config.json) on the pod's chips, and the plan's verdict for the command.
# Exit 0: go on (its lines on stdout); 10: refused (the reason); 3: this
# python lacks the requirements (jax, ml_collections); 4: the check itself
# failed (its traceback on stderr).
LOCAL_CHECK=$(cat <<'EOF'
import sys, traceback
try:
  import jax, ml_collections
  from ada_jax import plan
except ImportError:
  sys.exit(3)
try:
  plan.main(sys.argv[1:])
except Exception:
  traceback.print_exc()
  sys.exit(4)
EOF
)

cmd_create() {
  require
  [[ -n $TPU_TYPE ]] || die "create needs an accelerator type: --type v4-32|v5p-64|v6e-64 or ADA_TPU_TYPE"
  describe_pod
  local version=$TPU_VERSION
  [[ -n $version ]] || version=$(default_version "$TPU_TYPE") \
    || die "no default runtime version for '$TPU_TYPE': pass --version"
  local flags=(--accelerator-type="$TPU_TYPE" --version="$version")
  (( SPOT && PREEMPTIBLE )) && die "--spot and --preemptible exclude each other"
  (( SPOT )) && flags+=(--spot)
  (( PREEMPTIBLE )) && flags+=(--preemptible)
  x gcloud compute tpus tpu-vm create "$TPU_NAME" "${LOC[@]}" "${flags[@]}" ${REST[@]+"${REST[@]}"}
}

cmd_setup() {
  require
  describe_pod
  local commit=HEAD
  TARBALL="${TMPDIR:-/tmp}/ada_jax-$TPU_NAME.tar.gz"
  if (( DRY_RUN )); then
    note "refuses to ship when tracked files have uncommitted changes (--allow-dirty: warn)"
    show_cmd git -C "$REPO_ROOT" status --porcelain --untracked-files=no
  else
    if [[ -n $(git -C "$REPO_ROOT" status --porcelain --untracked-files=no) ]]; then
      (( ALLOW_DIRTY )) || die "uncommitted changes in tracked files; setup ships HEAD only: commit them, or pass --allow-dirty"
      echo "launch_tpu.sh: warning: uncommitted changes are NOT shipped; the workers get HEAD" >&2
    fi
    commit=$(git -C "$REPO_ROOT" rev-parse --short=12 HEAD)
    trap 'rm -f "$TARBALL"' EXIT
  fi
  x git -C "$REPO_ROOT" archive --format=tar.gz -o "$TARBALL" HEAD
  x gcloud compute tpus tpu-vm scp "$TARBALL" "$TPU_NAME:ada_jax.tar.gz" "${LOC[@]}" --worker=all
  ssh_workers all "$(remote COMMIT "$commit" JAX_TPU_VERSION "$JAX_TPU_VERSION" \
      GCSFS_VERSION "$GCSFS_VERSION" FIND_LINKS "$LIBTPU_FIND_LINKS" <<EOF
$TPU_FREE_CHECK
# jax $JAX_TPU_VERSION needs Python >= 3.11; the Ubuntu 22.04 runtimes ship 3.10.
ok() { "\$1" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; }
py=""
for c in python3.13 python3.12 python3.11 python3; do
  if command -v "\$c" >/dev/null && ok "\$c"; then py=\$c; break; fi
done
# On a fresh VM, unattended-upgrades may hold the dpkg lock: wait for it.
apt_install() {
  sudo apt-get -qq -o DPkg::Lock::Timeout=600 update
  sudo DEBIAN_FRONTEND=noninteractive apt-get -qq -o DPkg::Lock::Timeout=600 install -y "\$@"
}
if [[ -z \$py ]]; then apt_install python3.11 python3.11-venv; py=python3.11; fi
# Debian/Ubuntu keep ensurepip (needed by venv) in a separate package.
"\$py" -c 'import ensurepip' 2>/dev/null || apt_install "\$py-venv"
# Unpack beside the old tree, then swap, so a failed copy leaves a whole tree.
rm -rf "\$CODE_DIR.new" && mkdir -p "\$CODE_DIR.new" "\$LOG_DIR"
tar -xzf "\$HOME/ada_jax.tar.gz" -C "\$CODE_DIR.new"
echo "\$COMMIT" > "\$CODE_DIR.new/COMMIT"
rm -rf "\$CODE_DIR" && mv "\$CODE_DIR.new" "\$CODE_DIR"
ok "\$VENV/bin/python" || { rm -rf "\$VENV"; "\$py" -m venv "\$VENV"; }
"\$VENV/bin/pip" install -q --upgrade pip
"\$VENV/bin/pip" install -q -r "\$CODE_DIR/requirements.txt"
# -c keeps every package requirements.txt pins at its pinned version.
"\$VENV/bin/pip" install -q \${FIND_LINKS:+-f "\$FIND_LINKS"} "jax[tpu]==\$JAX_TPU_VERSION" "gcsfs==\$GCSFS_VERSION" -c "\$CODE_DIR/requirements.txt"
# The reference's graders (evaluate --graders ada,reference: the paper's Table 1).
"\$VENV/bin/pip" install -q -e "\${CODE_DIR}[math_verify]" -c "\$CODE_DIR/requirements.txt"
echo "\$(hostname): code \$COMMIT, \$("\$VENV/bin/python" -c 'import jax; print("jax", jax.__version__)')"
EOF
)"
  (( NO_CHECK )) && return 0
  local config=${REST[0]:-configs/qwen25_math_1p5b.py${TPU_TYPE:+:tpu=$TPU_TYPE}} file
  file=${config%%:*}
  [[ $file == */* ]] || file="configs/${file%.py}.py"  # tiny_arith -> configs/tiny_arith.py
  config=$file${config#"${config%%:*}"}
  note "pod check on every worker: $config"
  pod_check "$config" 0 ${REST[@]+"${REST[@]:1}"}
}

# pod_check CONFIG LAYERS [--config.key=value ...]: all workers at once, as
# the job will run (multi-host init included): the config's mesh builds on
# the chips, each host feeds its rows, the plan fits them (with LAYERS > 0
# the programs also compile at that depth). One line per worker; any failure
# fails the command.
pod_check() {
  local config=$1 layers=$2 args="" a
  shift 2
  for a in -m ada_jax.plan --pod-check --layers "$layers" --config "$config" "$@"; do
    args+=" $(sq "$a")"
  done
  (( IGNORE_PLAN )) && args+=" --ignore-plan"
  ssh_workers all "$(remote <<EOF
cd "\$CODE_DIR"
export ADA_DISTRIBUTED=1
timeout 1800 "\$VENV/bin/python"$args
EOF
)"
}

# check_here COMMAND CONFIG[:ARGS] [--config.key=value ...] [PLAN_ARGS...]:
# LOCAL_CHECK with the first python that has the requirements; dies with its
# reason when it refuses (nothing has touched the pod yet); --ignore-plan
# turns a plan that does not fit into a warning. No such python: a warning,
# unchecked. A config file not in this checkout: a warning, unchecked.
check_here() {
  local cmd=$1 config=$2 py msg rc err line args
  shift 2
  if [[ ! -f $REPO_ROOT/${config%%:*} ]]; then
    echo "launch_tpu.sh: warning: ${config%%:*} is not in this checkout, so not checked here; the workers run the tree shipped by setup" >&2
    return
  fi
  args=(--launch-check "$cmd" --config "$config" "$@")
  [[ -z $TPU_TYPE ]] || args+=(--pod "$TPU_TYPE")
  (( IGNORE_PLAN )) && args+=(--ignore-plan)
  err=$(mktemp "${TMPDIR:-/tmp}/ada_check.XXXXXX")
  for py in "${ADA_PYTHON:-}" "$REPO_ROOT/.venv/bin/python" python3; do
    if [[ -z $py ]] || ! command -v "$py" >/dev/null; then continue; fi
    rc=0
    msg=$(cd "$REPO_ROOT" && "$py" -c "$LOCAL_CHECK" "${args[@]}" 2>"$err") || rc=$?
    case $rc in
      0) rm -f "$err"
         while IFS= read -r line; do
           if [[ $line == warning:* ]]; then echo "launch_tpu.sh: $line" >&2
           elif [[ -n $line ]]; then note "$line"; fi
         done <<<"$msg"
         return ;;
      10) rm -f "$err"; die "$msg" ;;
      2|4) line=$(tail -n 1 "$err"); rm -f "$err"
         die "the check here failed ($py): ${line:-no message}" ;;
    esac  # Other codes (3: no jax or ml_collections): this python cannot check.
  done
  rm -f "$err"
  echo "launch_tpu.sh: warning: no local python with jax and ml_collections (set ADA_PYTHON): config not checked here" >&2
}

cmd_run() {
  require
  (( ${#REST[@]} )) || die "run needs a config: run CONFIG[:ARGS] [--config.key=value ...]"
  local config=${REST[0]} overrides=(${REST[@]+"${REST[@]:1}"}) o file
  [[ $config != -* ]] || die "run needs the config first: run CONFIG[:ARGS] [--config.key=value ...]"
  file=${config%%:*}
  [[ $file == */* ]] || file="configs/${file%.py}.py"  # tiny_arith -> configs/tiny_arith.py
  config=$file${config#"${config%%:*}"}
  for o in ${overrides[@]+"${overrides[@]}"}; do
    [[ $o == --config.* ]] || die "run takes only --config.key=value after the config, got '$o'"
  done
  [[ -n $WORKDIR ]] || die "run needs --workdir gs://BUCKET/DIR (or ADA_WORKDIR)"
  [[ $WORKDIR == gs://* ]] || die "--workdir must be gs://...: all workers write one checkpoint, and a preempted VM's disk is gone"
  check_here run "$config" ${overrides[@]+"${overrides[@]}"}
  local main_args=(-m ada_jax.main --config "$config" --workdir "$WORKDIR" ${overrides[@]+"${overrides[@]}"})
  describe_pod
  note "1/3: check every worker is set up and its TPU is free (all or none start)"
  workers_ready
  note "2/3: pod check on every worker (mesh, rows, plan; programs at 2 layers)"
  pod_check "$config" 2 ${overrides[@]+"${overrides[@]}"}
  note "3/3: start the job on every worker"
  start_job "$(basename "$WORKDIR")" "${CACHE_DIR:-${WORKDIR%/}/jax_cache}" "${main_args[@]}"
}

# Every worker has the code and a venv, and nothing holds its TPU.
workers_ready() {
  ssh_workers all "$(remote <<EOF
[[ -f \$CODE_DIR/COMMIT && -x \$VENV/bin/python ]] || { echo "\$(hostname): not set up; ./launch_tpu.sh setup" >&2; exit 1; }
$TPU_FREE_CHECK
echo "\$(hostname): code \$(cat "\$CODE_DIR/COMMIT"), ready"
EOF
)"
}

# Starts `python ARGS...` on every worker as the pod's job (run, eval and
# export alike): nohup, one log per job and worker, the pid and exit-code
# files status and stop read, ADA_DISTRIBUTED=1 (multi-host JAX), the
# persistent compilation cache, the --env variables. LOG_NAME names the log.
start_job() {  # LOG_NAME CACHE_DIR ARG...
  local log_name=$1 cache=$2 stamp e env_lines="" py_args="" a
  shift 2
  stamp=$(date -u +%Y%m%dT%H%M%SZ)
  for e in ${EXTRA_ENV[@]+"${EXTRA_ENV[@]}"}; do
    env_lines+="export ${e%%=*}=$(sq "${e#*=}")"$'\n'
  done
  for a in "$@"; do py_args+=" $(sq "$a")"; done
  ssh_workers all "$(remote RUN_NAME "$log_name" STAMP "$stamp" <<EOF
cd "\$CODE_DIR"
mkdir -p "\$LOG_DIR"
log="\$LOG_DIR/\$RUN_NAME.\$STAMP.log"
export ADA_DISTRIBUTED=1
export JAX_COMPILATION_CACHE_DIR=$(sq "$cache")
${env_lines}cmd=("\$VENV/bin/python"$py_args)
echo "\$(date -u) \$(hostname) code \$(cat COMMIT): \${cmd[*]}" > "\$log"
rm -f "\$PID_FILE" "\$RC_FILE"
wrapper=\$(cat <<'JOB'
$JOB_WRAPPER
JOB
)
# setsid: a session apart from this ssh one. The wrapper starts the job in a
# process group it leads (so stop can end its children), writes its pid to
# PID_FILE and, when it ends, its exit code to RC_FILE (status reads it).
# trap -: SIGINT reaches the job as an interrupt (a background job ignores it).
(trap - INT QUIT; exec nohup setsid bash -c "\$wrapper" job "\$PID_FILE" "\$RC_FILE" "\${cmd[@]}" >> "\$log" 2>&1 < /dev/null) &
for (( i = 0; i < 100; i++ )); do [[ -s \$PID_FILE ]] && break; sleep 0.1; done
[[ -s \$PID_FILE ]] || { echo "\$(hostname): the job did not start; see \$log" >&2; exit 1; }
ln -sfn "\$log" "\$LOG_DIR/latest.log"
echo "\$(hostname): started pid \$(cat "\$PID_FILE"), log \$log"
EOF
)"
}

# The value of option NAME in ARGS ("--name V" or "--name=V"); empty if absent.
arg_value() {  # NAME ARG...
  local name=$1
  shift
  while (( $# )); do
    case $1 in
      "$name") echo "${2-}"; return ;;
      "$name"=*) echo "${1#*=}"; return ;;
    esac
    shift
  done
}

# eval and export: the command's own arguments, as `python -m ada_jax.evaluate`
# / `ada_jax.export` take them, run on every worker as the pod's job. The
# paths in GS_ARGS must be gs:// (every worker reads and writes the same
# objects); JOB_DIR (the run or HF directory) names the log and, without
# --cache-dir, holds the compilation cache.
pod_command() {  # CMD MODULE JOB_DIR "REQUIRED_ARGS" "GS_ARGS" ARG...
  local cmd=$1 module=$2 job_dir=$3 required=$4 gs_args=$5 o v config overrides=()
  shift 5
  for o in $required; do
    [[ -n $(arg_value "$o" "$@") ]] || die "$cmd needs $o (it takes the arguments of python -m $module; launcher options go before the command)"
  done
  for o in $gs_args; do
    v=$(arg_value "$o" "$@")
    [[ -z $v || $v == gs://* ]] || die "$o $v: must be gs://... on a pod (every worker reads and writes the same objects)"
  done
  for o in "$@"; do [[ $o == --config.* ]] && overrides+=("$o"); done
  config=$(arg_value --config "$@")
  # evaluate's new tokens size its chunk in the plan; its --slots is checked.
  v=$(arg_value --max-new-tokens "$@")
  [[ -z $v ]] || overrides+=(--eval-new-tokens "$v")
  v=$(arg_value --slots "$@")
  [[ -z $v || $cmd != eval ]] || overrides+=(--eval-slots "$v")
  [[ -z $config ]] || check_here "$cmd" "$config" ${overrides[@]+"${overrides[@]}"}
  describe_pod
  note "1/2: check every worker is set up and its TPU is free (all or none start)"
  workers_ready
  note "2/2: start python -m $module on every worker"
  start_job "$cmd.$(basename "$job_dir")" "${CACHE_DIR:-${job_dir%/}/jax_cache}" -m "$module" "$@"
}

# Here, not on the pod: the machine with internet downloads the config's
# model and sets into the bucket once (python -m ada_jax.stage); every worker
# then reads them from there.
cmd_stage() {
  local py
  for py in "${ADA_PYTHON:-}" "$REPO_ROOT/.venv/bin/python" python3; do
    [[ -n $py ]] && command -v "$py" >/dev/null && "$py" -c 'import ada_jax.stage' 2>/dev/null && break
    py=""
  done
  [[ -n $py ]] || die "stage needs a python with ada_jax installed here (pip install -e .; or set ADA_PYTHON)"
  (cd "$REPO_ROOT" && x "$py" -m ada_jax.stage ${REST[@]+"${REST[@]}"})
}

cmd_eval() {
  require
  pod_command eval ada_jax.evaluate "$(arg_value --checkpoint ${REST[@]+"${REST[@]}"})" \
    "--config --checkpoint" "--checkpoint --out" ${REST[@]+"${REST[@]}"}
}

cmd_export() {
  require
  pod_command export ada_jax.export "$(arg_value --workdir ${REST[@]+"${REST[@]}"})" \
    "--workdir --out" "--workdir --out" ${REST[@]+"${REST[@]}"}
}

cmd_logs() {
  require
  local w=${WORKER:-0} tail_cmd
  [[ $w == all || $w =~ ^[0-9]+$ ]] || die "--worker wants a number or 'all', got '$w'"
  local topo
  if [[ $w != all && -n $TPU_TYPE ]] && topo=$(topology "$TPU_TYPE"); then
    (( w < ${topo%% *} )) || die "--worker $w: $TPU_TYPE has workers 0..$(( ${topo%% *} - 1 ))"
  fi
  tail_cmd="tail -n $LINES"
  # Following several workers at once would interleave their lines.
  (( FOLLOW )) && [[ $w != all ]] && tail_cmd+=" -F"
  x gcloud compute tpus tpu-vm ssh "$TPU_NAME" "${LOC[@]}" --worker="$w" \
    --command="$tail_cmd \"\$HOME/ada_logs/latest.log\""
}

cmd_status() {
  require
  describe_pod
  x gcloud compute tpus tpu-vm describe "$TPU_NAME" "${LOC[@]}" --format='value(state,acceleratorType,health)'
  ssh_workers all "$({ echo "$JOB_ENDED"; cat <<'EOF'
set +e
state="no job"
if [[ -f $PID_FILE ]] && kill -0 "$(cat "$PID_FILE")" 2>/dev/null; then
  state="running pid $(cat "$PID_FILE")"
elif [[ -f $PID_FILE || -f $RC_FILE ]]; then  # stop removes PID_FILE, not RC_FILE.
  state=$(job_ended)
fi
job=$(basename "$(readlink "$LOG_DIR/latest.log" 2>/dev/null)" .log)  # run/eval/export
echo "$(hostname): code $(cat "$CODE_DIR/COMMIT" 2>/dev/null || echo none), $state${job:+ ($job)}: $(tail -n 1 "$LOG_DIR/latest.log" 2>/dev/null)"
EOF
} | remote)"
}

cmd_stop() {
  require
  describe_pod
  ssh_workers all "$({ echo "$JOB_ENDED"; cat <<'EOF'
[[ -f $PID_FILE ]] || { echo "$(hostname): no job"; exit 0; }
pid=$(cat "$PID_FILE")
if kill -0 "$pid" 2>/dev/null && (( ! FORCE )); then
  # SIGTERM to the main process only, as a preemption does: the trainer saves
  # the last completed step at once on every host and exits (a step in
  # sampling is dropped, one in its update finishes first); where the plan's
  # write would miss the preemption notice it exits at once without one.
  kill -TERM "$pid"
  for (( t = 0; t < GRACE; t++ )); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  if kill -0 "$pid" 2>/dev/null; then echo "$(hostname): still running after ${GRACE}s, SIGKILL" >&2; fi
fi
# The whole group (verifier pool included), so nothing is left holding the TPU.
kill -KILL -- "-$pid" 2>/dev/null || true
sudo rm -f /tmp/libtpu_lockfile 2>/dev/null || true
rm -f "$PID_FILE"
# Its wrapper writes the exit code as it ends (75: checkpointed; 137: killed).
for (( t = 0; t < 50; t++ )); do [[ -f $RC_FILE ]] && break; sleep 0.1; done
echo "$(hostname): job $pid stopped, $(job_ended)"
EOF
} | remote FORCE "$FORCE" GRACE "$GRACE")"
}

cmd_delete() {
  require
  local q=()
  (( YES )) && q=(--quiet)
  x gcloud compute tpus tpu-vm delete "$TPU_NAME" "${LOC[@]}" ${q[@]+"${q[@]}"}
}

cmd_ssh() {
  require
  (( ${#REST[@]} )) || die "ssh needs a command: ssh -- CMD..."
  local w=${WORKER:-all}
  [[ $w == all || $w =~ ^[0-9]+$ ]] || die "--worker wants a number or 'all', got '$w'"
  x gcloud compute tpus tpu-vm ssh "$TPU_NAME" "${LOC[@]}" --worker="$w" --command="${REST[*]}"
}

main() {
  (( $# )) || { usage; exit 2; }
  local cmd="" need
  while (( $# )); do
    need=1
    case $1 in
      -h|--help) usage; exit 0 ;;
      --name) TPU_NAME=${2-} ;;
      --zone) ZONE=${2-} ;;
      --project) PROJECT=${2-} ;;
      --type) TPU_TYPE=${2-} ;;
      --version) TPU_VERSION=${2-} ;;
      --workdir) WORKDIR=${2-} ;;
      --cache-dir) CACHE_DIR=${2-} ;;
      --env) EXTRA_ENV+=("${2-}") ;;
      --worker) WORKER=${2-} ;;
      --lines) LINES=${2-} ;;
      --grace) GRACE=${2-} ;;
      --dry-run) DRY_RUN=1; need=0 ;;
      --spot) SPOT=1; need=0 ;;
      --preemptible) PREEMPTIBLE=1; need=0 ;;
      --allow-dirty) ALLOW_DIRTY=1; need=0 ;;
      --no-check) NO_CHECK=1; need=0 ;;
      --ignore-plan) IGNORE_PLAN=1; need=0 ;;
      --force) FORCE=1; need=0 ;;
      --yes) YES=1; need=0 ;;
      --no-follow) FOLLOW=0; need=0 ;;
      --) shift; REST+=("$@"); break ;;
      --config.*) REST+=("$1"); need=0 ;;
      -*) die "unknown option '$1' (see -h)" ;;
      *) if [[ -z $cmd ]]; then cmd=$1; else REST+=("$1"); fi; need=0
         # eval and export take their command's own arguments (--workdir,
         # --out, --step... are evaluate's / export's, not the launcher's).
         if [[ $cmd == eval || $cmd == export || $cmd == stage ]]; then shift; REST+=("$@"); break; fi ;;
    esac
    if (( need )); then
      [[ $# -ge 2 && -n $2 ]] || die "$1 needs a value"
      shift
    fi
    shift
  done
  [[ $LINES =~ ^[0-9]+$ ]] || die "--lines wants a number, got '$LINES'"
  [[ $GRACE =~ ^[0-9]+$ ]] || die "--grace wants seconds, got '$GRACE'"
  (( DRY_RUN )) && note "dry run: nothing is executed"
  case $cmd in
    create|setup|stage|run|eval|export|logs|status|stop|delete|ssh) "cmd_$cmd" ;;
    "") usage >&2; die "no command" ;;
    *) die "unknown command '$cmd' (see -h)" ;;
  esac
}

main "$@"
