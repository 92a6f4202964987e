# cmake -D BIN=unit-test-binary -P catch_guard.cmake (see catch_tests.cmake): a run of BIN that
# names a test case no case has must fail, with Catch2's "No test cases matched" and exit 2.
# The name is shaped like the second half of one that catch_discover_tests split at a ';'.
execute_process(COMMAND ${BIN} " no test case has this name"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 2 OR NOT out MATCHES "No test cases matched")
  message(FATAL_ERROR "a run that matched no test case did not fail (exit ${rc}):\n${out}")
endif()
message(STATUS "a run that matches no test case fails (exit 2)")
