mesh_add_fuzzer(fuzz_wire_graph SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_wire_graph.cpp LIBS mesh_wire)
target_include_directories(fuzz_wire_graph PRIVATE ${PROJECT_SOURCE_DIR}/tests/graph)
mesh_add_fuzzer(fuzz_safetensors SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_safetensors.cpp LIBS mesh_graph)
