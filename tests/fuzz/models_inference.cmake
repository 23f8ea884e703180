# Fuzzers of mesh_inference's readers of outside input: adapter_config.json of a LoRA adapter
# (fuzz_peft_config: an error naming the file, or a config within meshnode's bounds), and the
# tokenizer files written from a GGUF file's vocabulary (fuzz_hf_export: an error, or files that
# read back as that vocabulary).
if(TARGET mesh_inference)
  mesh_add_fuzzer(fuzz_peft_config SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_peft_config.cpp LIBS mesh_inference)
  mesh_add_fuzzer(fuzz_hf_export SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_hf_export.cpp LIBS mesh_inference)
endif()
