# Small helpers shared by every layer's CMakeLists.txt.

# mesh_add_test(<name> SOURCES <files...> LIBS <libs...> [LABELS <labels...>] [PROPERTIES <ctest props...>])
# One Catch2 executable per unit; every TEST_CASE becomes its own ctest test.
function(mesh_add_test name)
  cmake_parse_arguments(arg "" "" "SOURCES;LIBS;LABELS;PROPERTIES" ${ARGN})
  add_executable(${name} ${arg_SOURCES})
  target_link_libraries(${name} PRIVATE ${arg_LIBS} Catch2::Catch2WithMain)
  set(labels ${arg_LABELS})
  if(NOT labels)
    set(labels unit)
  endif()
  catch_discover_tests(${name} PROPERTIES LABELS "${labels}" ${arg_PROPERTIES} DISCOVERY_TIMEOUT 60)
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
