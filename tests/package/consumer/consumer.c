/* The installed C API: the version agrees with the header, an engine is made with options and
 * reports its counters, and a bad call is an error with a message naming the argument. Needs
 * no GPU. */
#include <gmjit/gmjit.h>
#include <stdio.h>
#include <string.h>

int main(void) {
  gmjit_engine* engine = NULL;
  gmjit_engine_options options;
  gmjit_engine_counters counters;
  gmjit_status status;
  if (!GMJIT_VERSION_COMPATIBLE(gmjit_version())) {
    fprintf(stderr, "library version %d, header %d\n", gmjit_version(), GMJIT_VERSION);
    return 1;
  }
  gmjit_engine_options_init(&options);
  options.use_disk_cache = 0;
  status = gmjit_engine_create_ex(&options, &engine);
  if (status != GMJIT_OK) {
    fprintf(stderr, "gmjit_engine_create_ex: %s\n", gmjit_last_error());
    return 1;
  }
  status = gmjit_engine_get_counters(engine, &counters);
  if (status != GMJIT_OK || counters.plans_built != 0) {
    fprintf(stderr, "gmjit_engine_get_counters: %s\n", gmjit_last_error());
    return 1;
  }
  status = gmjit_forward(engine, NULL, NULL, 0, NULL);
  if (status != GMJIT_INVALID_ARGUMENT || strstr(gmjit_last_error(), "layer") == NULL) {
    fprintf(stderr, "a null layer gave %s: '%s'\n", gmjit_status_string(status),
            gmjit_last_error());
    return 1;
  }
  gmjit_engine_destroy(engine);
  printf("C consumer ok\n");
  return 0;
}
