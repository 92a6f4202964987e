# Runs one libFuzzer target for a bounded time over a fresh copy of its seed corpus, so the
# corpus in the repository is never written to. Variables: FUZZER, SEED_DIR, WORK_DIR, SECONDS.
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
file(COPY "${SEED_DIR}/" DESTINATION "${WORK_DIR}")
execute_process(
  COMMAND "${FUZZER}" -max_total_time=${SECONDS} -timeout=5 -print_final_stats=1 "${WORK_DIR}"
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${FUZZER} failed with ${rc}")
endif()
