# Fuzzers of the checkpoint readers (models/, mesh_checkpoint): files a user points meshnode at are
# input like any peer's message. fuzz_gguf: the GGUF reader and GGUF model configs;
# fuzz_hf_safetensors: the safetensors view, the shard index and config.json.
if(TARGET mesh_checkpoint)
  mesh_add_fuzzer(fuzz_gguf SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_gguf.cpp LIBS mesh_checkpoint)
  mesh_add_fuzzer(fuzz_hf_safetensors SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_hf_safetensors.cpp LIBS mesh_checkpoint)
endif()
