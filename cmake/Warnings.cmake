# Our own code builds warning-free; third-party headers are included as SYSTEM.
function(gmjit_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Werror -Wno-missing-field-initializers)
endfunction()
