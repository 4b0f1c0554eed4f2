# Kernel groups compiled on first use (include/gemmt/deferred.h, kernels/deferred/).
#
#   gemmt_defer_groups(<sources variable>)
# removes the files of every group in GEMMT_DEFERRED_GROUPS (sources.txt: deferred_<group>)
# from the kernel sources and marks the loader's files with the groups.
#
#   gemmt_write_deferred_config(<groups>)
# writes gemmt_deferred_config.h: the nvcc command the kernel library's own objects compile
# with (so that a group's library holds the same code), the groups' files and the source
# tree, for kernels/deferred/deferred_loader.cu. Called once the compile flags are known.
#
#   gemmt_deferred_compile_check()
# (CPU-only builds that compile the kernels as a check) compiles the loader and the forwarding
# definitions as if every group were deferred, so that path cannot break unseen either.

set(GEMMT_DEFERRABLE_GROUPS fp8 grouped16 tf32 fp64 simt16 simt32_scalar decode ladder)

# One nvcc argument a line, as a C string literal's contents.
function(gemmt_c_lines out)
  set(text "")
  foreach(arg IN LISTS ARGN)
    string(REPLACE "\\" "\\\\" arg "${arg}")
    string(REPLACE "\"" "\\\"" arg "${arg}")
    string(APPEND text "${arg}\\n")
  endforeach()
  set(${out} "${text}" PARENT_SCOPE)
endfunction()

# --generate-code flags of CMAKE_CUDA_ARCHITECTURES entries (90a, 80-real, 90-virtual).
function(gemmt_gencode_flags out)
  set(flags "")
  foreach(arch IN LISTS ARGN)
    if(arch MATCHES "^([0-9]+[a-z]?)-real$")
      list(APPEND flags "--generate-code=arch=compute_${CMAKE_MATCH_1},code=[sm_${CMAKE_MATCH_1}]")
    elseif(arch MATCHES "^([0-9]+[a-z]?)-virtual$")
      list(APPEND flags "--generate-code=arch=compute_${CMAKE_MATCH_1},code=[compute_${CMAKE_MATCH_1}]")
    else()
      list(APPEND flags "--generate-code=arch=compute_${arch},code=[compute_${arch},sm_${arch}]")
    endif()
  endforeach()
  set(${out} "${flags}" PARENT_SCOPE)
endfunction()

function(gemmt_write_deferred_config groups)
  set(files "")
  foreach(group IN LISTS groups)
    foreach(file IN LISTS GEMMT_SRC_deferred_${group})
      file(RELATIVE_PATH rel "${PROJECT_SOURCE_DIR}" "${file}")
      string(APPEND files "${group}:${rel}\\n")
    endforeach()
  endforeach()
  set(support "")
  foreach(file IN LISTS GEMMT_SRC_deferred_support)
    file(RELATIVE_PATH rel "${PROJECT_SOURCE_DIR}" "${file}")
    string(APPEND support "${rel}\\n")
  endforeach()
  # The kernel library's compile line (CMakeLists.txt), in CMake's order.
  set(ccbin "")
  if(CMAKE_CUDA_HOST_COMPILER)
    set(ccbin "-ccbin=${CMAKE_CUDA_HOST_COMPILER}")
  endif()
  set(defs "")
  foreach(def IN LISTS GEMMT_DEFINITIONS)
    list(APPEND defs "-D${def}")
  endforeach()
  list(SORT defs)
  separate_arguments(common UNIX_COMMAND "${CMAKE_CUDA_FLAGS} ${CMAKE_CUDA_FLAGS_${GEMMT_CONFIG}}")
  gemmt_gencode_flags(gencode ${GEMMT_CUDA_ARCHS})
  gemmt_c_lines(flags ${ccbin} -forward-unknown-to-host-compiler ${defs} ${common} ${gencode}
                -Xcompiler=-fPIC ${GEMMT_LINEINFO_FLAG} ${GEMMT_FATBIN_COMPRESSION}
                --expt-relaxed-constexpr -Xcompiler=-fvisibility=hidden -std=c++17)
  gemmt_c_lines(link_flags ${ccbin})
  set(split "")
  if(GEMMT_SPLIT_COMPILE GREATER 1 AND CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.1)
    set(split "--split-compile=${GEMMT_SPLIT_COMPILE}")
  endif()
  string(REPLACE ";" "," group_list "${groups}")
  file(CONFIGURE OUTPUT "${PROJECT_BINARY_DIR}/generated/gemmt_deferred_config.h" CONTENT
"// Written by cmake/GemmtDeferred.cmake: how kernels/deferred/deferred_loader.cu builds a group.
#pragma once
#define GEMMT_DEFERRED_GROUP_LIST \"${group_list}\"
#define GEMMT_DEFERRED_NVCC \"${CMAKE_CUDA_COMPILER}\"
#define GEMMT_DEFERRED_FLAGS \"${flags}\"
#define GEMMT_DEFERRED_LINK_FLAGS \"${link_flags}\"
#define GEMMT_DEFERRED_SPLIT_FLAG \"${split}\"
#define GEMMT_DEFERRED_SOURCE_DIR \"${PROJECT_SOURCE_DIR}\"
#define GEMMT_DEFERRED_FILES \"${files}\"
#define GEMMT_DEFERRED_SUPPORT_FILES \"${support}\"
")
endfunction()

function(gemmt_defer_groups sources_var)
  set(sources "${${sources_var}}")
  foreach(group IN LISTS GEMMT_DEFERRED_GROUPS)
    if(NOT group IN_LIST GEMMT_DEFERRABLE_GROUPS)
      message(FATAL_ERROR "gemmt: GEMMT_DEFERRED_GROUPS names '${group}'; the groups are "
                          "${GEMMT_DEFERRABLE_GROUPS}")
    endif()
    list(REMOVE_ITEM sources ${GEMMT_SRC_deferred_${group}})
  endforeach()
  set(${sources_var} "${sources}" PARENT_SCOPE)
  if(NOT GEMMT_DEFERRED_GROUPS)
    return()
  endif()
  set(defs GEMMT_DEFERRED_KERNELS)
  foreach(group IN LISTS GEMMT_DEFERRED_GROUPS)
    string(TOUPPER "${group}" upper)
    list(APPEND defs GEMMT_DEFER_${upper})
  endforeach()
  # The headers' digest, rewritten whenever a header changes, so the loader can refuse a
  # group whose sources no longer match the module (cmake/header_digest.py).
  if(NOT Python_EXECUTABLE)
    find_package(Python 3.9 COMPONENTS Interpreter)
  endif()
  set(loader_depends "")
  if(Python_EXECUTABLE)
    file(GLOB_RECURSE headers CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/include/*.h"
         "${PROJECT_SOURCE_DIR}/kernels/*.h" "${PROJECT_SOURCE_DIR}/kernels/*.cuh")
    set(digest "${PROJECT_BINARY_DIR}/generated/gemmt_header_digest.h")
    add_custom_command(
      OUTPUT "${digest}"
      COMMAND "${Python_EXECUTABLE}" "${PROJECT_SOURCE_DIR}/cmake/header_digest.py"
              "${PROJECT_SOURCE_DIR}" "${digest}"
      DEPENDS ${headers} "${PROJECT_SOURCE_DIR}/cmake/header_digest.py"
      COMMENT "gemmt: digest of the headers")
    list(APPEND defs GEMMT_DEFERRED_DIGEST_HEADER)
    set(loader_depends "${digest}")
    list(APPEND sources "${digest}")
  endif()
  set(${sources_var} "${sources}" PARENT_SCOPE)
  set_source_files_properties(
    "${PROJECT_SOURCE_DIR}/kernels/deferred/deferred_trampolines.cu"
    PROPERTIES COMPILE_DEFINITIONS "${defs}"
               INCLUDE_DIRECTORIES "${PROJECT_BINARY_DIR}/generated")
  set_source_files_properties(
    "${PROJECT_SOURCE_DIR}/kernels/deferred/deferred_loader.cu"
    PROPERTIES COMPILE_DEFINITIONS "${defs}"
               INCLUDE_DIRECTORIES "${PROJECT_BINARY_DIR}/generated"
               OBJECT_DEPENDS "${loader_depends}")
  message(STATUS "gemmt: kernel groups compiled on first use: ${GEMMT_DEFERRED_GROUPS}")
endfunction()

function(gemmt_deferred_compile_check)
  gemmt_write_deferred_config("${GEMMT_DEFERRABLE_GROUPS}")
  set(defs GEMMT_DEFERRED_KERNELS ${GEMMT_DEFINITIONS})
  foreach(group IN LISTS GEMMT_DEFERRABLE_GROUPS)
    string(TOUPPER "${group}" upper)
    list(APPEND defs GEMMT_DEFER_${upper})
  endforeach()
  add_library(gemmt_deferred_check OBJECT "${PROJECT_SOURCE_DIR}/kernels/deferred/deferred_loader.cu"
                                          "${PROJECT_SOURCE_DIR}/kernels/deferred/deferred_trampolines.cu")
  target_include_directories(gemmt_deferred_check PRIVATE "${PROJECT_SOURCE_DIR}/include"
    "${PROJECT_SOURCE_DIR}/kernels" "${PROJECT_BINARY_DIR}/generated")
  target_compile_definitions(gemmt_deferred_check PRIVATE ${defs})
  target_compile_options(gemmt_deferred_check PRIVATE --expt-relaxed-constexpr)
  set_target_properties(gemmt_deferred_check PROPERTIES CUDA_ARCHITECTURES "${GEMMT_CUDA_ARCHS}")
endfunction()
