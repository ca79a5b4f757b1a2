# Multi-node SFT under Slurm: `source scripts/slurm_env.sh` in the batch script, before `python -m pipeline.run`.
# Exports the c10d rendezvous endpoint that the SFT command's `--rdzv_endpoint=${MASTER_ADDR}:${MASTER_PORT}` reads
# (pipeline/stages.py, torchrun_prefix): MASTER_ADDR, the job's first node, and MASTER_PORT, kept when already set,
# else 20000 + (job id mod 10000), below Linux's ephemeral ports, so jobs that share a first node do not collide.
if [ -z "${SLURM_JOB_NODELIST:-}" ] || [ -z "${SLURM_JOB_ID:-}" ]; then
    echo "slurm_env.sh: SLURM_JOB_NODELIST/SLURM_JOB_ID are not set; source it inside a Slurm job (sbatch)" >&2
    return 1 2>/dev/null || exit 1
fi
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_ADDR
export MASTER_PORT="${MASTER_PORT:-$((20000 + SLURM_JOB_ID % 10000))}"
