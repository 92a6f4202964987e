# Unit-test binaries (Catch2 v2) and their ctest entries.
#
#   wspush_catch_tests(TARGET [catch_discover_tests options...])
#
# Registers one ctest entry per test case (catch_discover_tests), each running its case by
# name, and one more, catch_guard_TARGET, that proves the binary fails a run whose names match
# no test case. catch_discover_tests cannot keep some names intact (a ';' splits one into
# several entries): such an entry matches nothing, and Catch2 alone would print "No tests ran"
# and exit 0. The binaries' main (tests/support/catch_main.cpp) turns that into exit 2; the
# guard fails if a binary is ever built without it.
include(Catch)

function(wspush_catch_tests target)
  catch_discover_tests(${target} ${ARGN})
  add_test(NAME catch_guard_${target}
    COMMAND ${CMAKE_COMMAND} -D BIN=$<TARGET_FILE:${target}> -P ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/catch_guard.cmake)
endfunction()
