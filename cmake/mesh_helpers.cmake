# Small helpers shared by every layer's CMakeLists.txt.

# mesh_add_test(<name> SOURCES <files...> LIBS <libs...> [LABELS <labels...>] [PROPERTIES <ctest props...>])
# One Catch2 executable per unit; every TEST_CASE becomes its own ctest test.
function(mesh_add_test name)
  cmake_parse_arguments(arg "" "" "SOURCES;LIBS;LABELS;PROPERTIES" ${ARGN})
  add_executable(${name} ${arg_SOURCES})
  target_link_libraries(${name} PRIVATE ${arg_LIBS} Catch2::Catch2WithMain)
  # Helpers shared by the tests of several layers (tests/common/*.hpp).
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests/common)
  set(labels ${arg_LABELS})
  if(NOT labels)
    set(labels unit)
  endif()
  # Labels are set from a file ctest reads after the discovered tests, not through PROPERTIES:
  # Catch2 v2 flattens list values there, so LABELS "a;b" became LABELS a plus a bogus property
  # "b" that swallowed the next name (RESOURCE_LOCK, TIMEOUT were silently lost).
  # --warn NoTests: a ctest entry whose name matches no test case fails instead of passing empty.
  # (A ';' in a TEST_CASE name splits it into a CMake list: the entry was a truncated name that
  # ran nothing and passed. Keep ';' out of test names.)
  catch_discover_tests(${name} TEST_LIST ${name}_TESTS PROPERTIES ${arg_PROPERTIES} DISCOVERY_TIMEOUT 60
    EXTRA_ARGS --warn NoTests)
  set(labels_file ${CMAKE_CURRENT_BINARY_DIR}/${name}_labels.cmake)
  file(WRITE ${labels_file} "if(${name}_TESTS)\n  set_tests_properties(\${${name}_TESTS} PROPERTIES LABELS \"${labels}\")\nendif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${labels_file})
endfunction()

# mesh_add_fuzzer(<name> SOURCES <files...> LIBS <libs...>)
# A libFuzzer target (clang only); built when MESH_FUZZ=ON, run briefly by `./dev.sh test`.
function(mesh_add_fuzzer name)
  cmake_parse_arguments(arg "" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${arg_SOURCES})
  target_compile_options(${name} PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_options(${name} PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(${name} PRIVATE ${arg_LIBS})
  set_property(GLOBAL APPEND PROPERTY MESH_FUZZERS ${name})
endfunction()
