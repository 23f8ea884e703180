mesh_add_fuzzer(fuzz_gpu_codegen SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_gpu_codegen.cpp LIBS mesh_gpu)
target_include_directories(fuzz_gpu_codegen PRIVATE ${PROJECT_SOURCE_DIR}/tests/gpu)
