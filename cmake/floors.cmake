# The include direction, enforced. Every library of ours is built and used through an include
# root of its own that holds links to its own folders (or single headers) and nothing else:
# `#include "server/conn/connections.hpp"` resolves only for a target that links a library
# exposing server/conn. Dependents see what a library exposes PUBLIC (or INTERFACE), so a
# floor that includes a header of a floor above it, or of one it does not depend on, fails to
# compile with "No such file or directory" (tests/layering proves it).
#
#   wspush_expose(TARGET PATH...)   PATHs relative to the project root: a folder or one header

function(wspush_expose target)
  set(root ${PROJECT_BINARY_DIR}/include/${target})
  foreach(rel IN LISTS ARGN)
    get_filename_component(parent ${root}/${rel} DIRECTORY)
    file(MAKE_DIRECTORY ${parent})
    if(NOT EXISTS ${root}/${rel})
      file(CREATE_LINK ${PROJECT_SOURCE_DIR}/${rel} ${root}/${rel} SYMBOLIC)
    endif()
  endforeach()
  get_target_property(kind ${target} TYPE)
  if(kind STREQUAL "INTERFACE_LIBRARY")
    target_include_directories(${target} INTERFACE ${root})
  else()
    target_include_directories(${target} PUBLIC ${root})
  endif()
endfunction()
