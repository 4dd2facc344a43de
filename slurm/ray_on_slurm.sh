#!/usr/bin/env bash
# Ray across the nodes of this Slurm allocation, then one command on the head node against it (verl RL),
# in the manner of verl's examples/slurm/ray_on_slurm.slurm. Runs on the host, inside the job:
#
#   slurm/ray_on_slurm.sh [--image IMAGE.sif] [--port 6379] -- COMMAND [ARGS...]
#
# Head: the node this runs on (the job's first node). Workers: every other node of the job, each started
# with `srun --overlap --nodes=1 --ntasks=1 -w NODE ray start --address HEAD:PORT --block`. Each node
# offers Ray the CPUs and GPUs Slurm gave the job there (SLURM_CPUS_PER_TASK, SLURM_GPUS_ON_NODE).
# COMMAND runs with RAY_ADDRESS=HEAD:PORT, so `ray.init()` (verl's main_ppo) joins this cluster.
# With --image, ray and COMMAND run in `apptainer exec --nv IMAGE` ($QREWRITE_APPTAINER_BIND is bound);
# without, they run on the host (ray must be on PATH, e.g. .venvs/verl/bin).
# Ray is stopped on every node when COMMAND ends; the exit status is COMMAND's.
set -euo pipefail

image="" port="${QREWRITE_RAY_PORT:-6379}"
while (($#)); do
  case "$1" in
    --image) image="$2"; shift 2 ;;
    --port) port="$2"; shift 2 ;;
    --) shift; break ;;
    *) echo "ray_on_slurm.sh: unknown option $1 (usage: [--image IMG] [--port N] -- COMMAND...)" >&2; exit 2 ;;
  esac
done
(($#)) || { echo "ray_on_slurm.sh: no COMMAND after --" >&2; exit 2; }
[[ -n "${SLURM_JOB_ID:-}" ]] || { echo "ray_on_slurm.sh: not inside a Slurm job (SLURM_JOB_ID unset)" >&2; exit 2; }

run=()
if [[ -n "$image" ]]; then
  run=(apptainer exec --nv)
  [[ -n "${QREWRITE_APPTAINER_BIND:-}" ]] && run+=(--bind "$QREWRITE_APPTAINER_BIND")
  run+=("$image")
fi

# The job's nodes from the controller: the step environment only describes this step's node.
nodelist=$(squeue -h -j "$SLURM_JOB_ID" -o %N)
mapfile -t nodes < <(scontrol show hostnames "$nodelist")
head_node=$(hostname -s)
[[ " ${nodes[*]} " == *" $head_node "* ]] || { echo "ray_on_slurm.sh: $head_node is not in the job's nodes ${nodes[*]}" >&2; exit 2; }
head_ip=$(hostname --ip-address | awk '{print $1}')
cpus="${SLURM_CPUS_PER_TASK:-1}"
gpus="${SLURM_GPUS_ON_NODE:-0}"
address="$head_ip:$port"
echo "ray_on_slurm: head $head_node ($address), ${#nodes[@]} node(s): ${nodes[*]}; per node $cpus CPUs, $gpus GPUs"

# Ray >= 2.52 authenticates with a token: `ray start` turns it on by itself where ~/.ray/auth_token exists (any
# earlier local ray.init() writes one), while a client given an address does not, and then fails
# "InvalidAuthToken". So the mode is set for the whole job, and in token mode (the default here) one token
# travels in the environment to the head, the workers (srun and apptainer pass it on) and COMMAND.
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-token}"
if [[ "$RAY_AUTH_MODE" == token && -z "${RAY_AUTH_TOKEN:-}" && -z "${RAY_AUTH_TOKEN_PATH:-}" ]]; then
  RAY_AUTH_TOKEN=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
  export RAY_AUTH_TOKEN
fi

pids=()
cleanup() {
  "${run[@]}" ray stop --force >/dev/null 2>&1 || true
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done  # ends the workers' srun steps
  wait 2>/dev/null || true
}
trap cleanup EXIT

"${run[@]}" ray start --head --node-ip-address="$head_ip" --port="$port" --num-cpus="$cpus" --num-gpus="$gpus" \
  --disable-usage-stats
for node in "${nodes[@]}"; do
  [[ "$node" == "$head_node" ]] && continue
  srun --overlap --nodes=1 --ntasks=1 -w "$node" "${run[@]}" \
    ray start --address="$address" --num-cpus="$cpus" --num-gpus="$gpus" --block &
  pids+=($!)
done

# Wait until every node has joined (Ray's own view), or fail naming the missing count.
want=${#nodes[@]}
deadline=$((SECONDS + ${QREWRITE_RAY_WAIT_S:-300}))
while ((SECONDS < deadline)); do
  probe_err=$(mktemp)
  have=$("${run[@]}" python -c "import ray; ray.init(address='$address', logging_level='ERROR'); print(sum(n['Alive'] for n in ray.nodes()))" 2>"$probe_err" | tail -1 || true)
  last_err=$(tail -n 3 "$probe_err"); rm -f "$probe_err"
  [[ "$have" == "$want" ]] && break
  for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null || { echo "ray_on_slurm.sh: a worker's srun exited" >&2; exit 1; }; done
  sleep 1
done
[[ "$have" == "$want" ]] || { echo "ray_on_slurm.sh: only ${have:-0} of $want Ray nodes joined; the last probe said: ${last_err:-nothing}" >&2; exit 1; }
echo "ray_on_slurm: $want node(s) joined; running: $*"

set +e
RAY_ADDRESS="$address" "${run[@]}" "$@"
status=$?
set -e
exit "$status"
