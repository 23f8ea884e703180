# Fuzzer of the WireGraph decoder (wire/wire_graph.hpp): never crashes, bounded memory, and what
# decodes validates and re-encodes to the same graph. (fuzz_messages, in actors.cmake, covers the
# message decoder and the engines that consume what it decodes.)
mesh_add_fuzzer(fuzz_wire_graph SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_wire_graph.cpp LIBS mesh_wire)
target_include_directories(fuzz_wire_graph PRIVATE ${PROJECT_SOURCE_DIR}/tests/graph)
