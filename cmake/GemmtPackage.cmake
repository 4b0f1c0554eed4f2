# Installs the kernel library as the CMake package "gemmt":
#   find_package(gemmt 0.1 REQUIRED)
#   target_link_libraries(app PRIVATE gemmt::kernels)
# gives the static library (with the planners' library gemmt::plan when there is one), the
# headers of include/ (gemmt/gemm.h: gemm_run, gemm_workspace_bytes, ...) and CUDA::cudart.
# No torch, no Python.
include(CMakePackageConfigHelpers)
include(GNUInstallDirs)

set(GEMMT_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/gemmt")

set(GEMMT_INSTALLED_TARGETS gemmt_kernels)
if(TARGET gemmt_plan)
  list(APPEND GEMMT_INSTALLED_TARGETS gemmt_plan)  # gemmt::plan, which gemmt::kernels links
endif()
install(TARGETS ${GEMMT_INSTALLED_TARGETS} EXPORT gemmtTargets
        ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}")
# Everything under include/gemmt is the public interface.
install(DIRECTORY include/gemmt DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")
install(EXPORT gemmtTargets NAMESPACE gemmt:: DESTINATION "${GEMMT_INSTALL_CMAKEDIR}")

# What the installed library was built for, so consumers can check it (gemmt_CUDA_ARCHITECTURES).
set(GEMMT_INSTALLED_CUDA_ARCHITECTURES "${GEMMT_CUDA_ARCHS}")
configure_package_config_file(cmake/gemmtConfig.cmake.in
  "${PROJECT_BINARY_DIR}/gemmtConfig.cmake" INSTALL_DESTINATION "${GEMMT_INSTALL_CMAKEDIR}")
write_basic_package_version_file("${PROJECT_BINARY_DIR}/gemmtConfigVersion.cmake"
  VERSION "${PROJECT_VERSION}" COMPATIBILITY SameMinorVersion)
install(FILES "${PROJECT_BINARY_DIR}/gemmtConfig.cmake"
              "${PROJECT_BINARY_DIR}/gemmtConfigVersion.cmake"
        DESTINATION "${GEMMT_INSTALL_CMAKEDIR}")
