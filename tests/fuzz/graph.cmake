mesh_add_fuzzer(fuzz_safetensors SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_safetensors.cpp LIBS mesh_graph)
