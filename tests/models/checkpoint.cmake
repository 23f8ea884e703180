# Tests of mesh_checkpoint: tensor types, dequantization (against tests/models/ref_dequantize.py,
# an independent numpy reference), GGUF, safetensors (single and sharded), the checkpoint view and
# model configs. Each test writes the small files it needs into a temporary directory.
if(TARGET mesh_checkpoint)
  mesh_add_test(models_checkpoint_tests
    SOURCES test_tensor_type.cpp test_dequantize.cpp test_gguf.cpp test_safetensors_view.cpp test_checkpoint.cpp
            test_model_config.cpp
    LIBS mesh_checkpoint)
  target_compile_definitions(models_checkpoint_tests PRIVATE
    MESH_MODELS_REF_DEQUANTIZE="${CMAKE_CURRENT_SOURCE_DIR}/ref_dequantize.py")
endif()
