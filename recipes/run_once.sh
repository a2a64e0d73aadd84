# Sourced by the ablation scripts. run_once RUN_DIR COMMAND [ARGS...]: runs COMMAND ARGS unless
# RUN_DIR/model exists (the run finished), adding --resume when RUN_DIR/checkpoints does (it was
# killed), so an interrupted ablation continues where it stopped.
run_once() {
  local run=$1
  shift
  [ -d "$run/model" ] && return 0
  local resume=()
  [ -d "$run/checkpoints" ] && resume=(--resume)
  echo "== $run"
  "$@" ${resume[@]+"${resume[@]}"}
}
