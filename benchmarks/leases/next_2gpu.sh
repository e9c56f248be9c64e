# The next 2-GPU lease (kind nvidia-h200-x2 or nvidia-h100-x2), sourced by benchmarks/lease.sh:
#   bash benchmarks/lease.sh start benchmarks/leases/next_2gpu.sh SECONDS
# In the order the issues were filed, what a machine of two GPUs can show:
#   1. issue 37 halved (both GPUs): colocated on 2 against one-step-off and fully async with 1 GPU training and 1
#      generating, then the report (results/async_rl_2gpu.json; about 11 min);
#   2. one GPU a lane until 7 min before the end: issue 41 on GPU 0 (tool-call traces, SFT, GRPO with and without the
#      tool, the report), issues 39, 38, 40 on GPU 1 (start-up cold and warm, the MoE update on TE grouped GEMM,
#      LoRA on SmolLM2);
#   3. issue 43 halved with what is left (two 1-GPU "nodes" against one node of both; the node's death).
# Transformer-engine must be installed (benchmarks/te/install.sh /tmp/site in a staging call): the MoE row needs it.

te_ready

# ---------------------------------------------------------------- 1. issue 37 on two GPUs
for row in async_rl_colocated_2 async_rl_one_step_off_1_1 async_rl_fully_async_1_1; do row_if 200 $L/o2 $row; done
python3 benchmarks/runs.py --out $L/o2 run async_rl_report_2gpu > $L/async_rl_report.log 2>&1
log "async_rl report rc $?: $(grep -h -E 'throughput|val_gain' $L/async_rl_report.log | head -n 4 | tr '\n' ' ')"
stop_leftovers

# ---------------------------------------------------------------- 2. one GPU a lane
A_END=$(( $(date +%s) + $(left) - 420 ))
log "lanes until $(( A_END - $(date +%s) ))s from now"
phase_rows 0 i41 $A_END agent_tools_traces agent_tools_sft agent_tools_grpo_tools agent_tools_grpo_no_tools &
phase_rows 1 i39 $A_END startup_smol moe_1b_te_train lora_smol &
wait
stop_leftovers
python3 benchmarks/runs.py --out $L/o_i41 run agent_tools_report > $L/agent_tools_report.log 2>&1
python3 benchmarks/runs.py --out $L/o_i39 run lora_report > $L/lora_report.log 2>&1
log "lanes done: 41: $(tr '\n' ' ' < $L/i41.rc); 39/38/40: $(tr '\n' ' ' < $L/i39.rc)"

# ---------------------------------------------------------------- 3. issue 43 on two GPUs
for row in two_nodes_one_node_2gpu two_nodes_two_nodes_socket_2gpu two_nodes_node_death_2gpu; do row_if 200 $L/o2 $row; done
python3 benchmarks/runs.py --out $L/o2 run two_nodes_report_2gpu > $L/two_nodes_report.log 2>&1
log "two_nodes report rc $?"
